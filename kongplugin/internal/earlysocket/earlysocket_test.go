package earlysocket

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain runs the test binary as a plugin server would be run when it is
// given a serving command line (-kong-prefix DIR): before it does
// anything else, its main connects to its own socket, which init opened.
func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == "-kong-prefix" {
		os.Exit(serveOnce(os.Args[2]))
	}
	os.Exit(m.Run())
}

// serveOnce connects to the socket the package's init opened, before
// taking it, then accepts that connection from it.
func serveOnce(prefix string) int {
	exe, _ := os.Executable()
	p := filepath.Join(prefix, filepath.Base(exe)+".socket")
	c, err := net.Dial("unix", p)
	if err != nil {
		fmt.Println("no socket before main:", err)
		return 1
	}
	defer c.Close()
	f := Take(p)
	if f == nil {
		fmt.Println("Take returned nothing")
		return 1
	}
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer l.Close()
	s, err := l.Accept()
	if err != nil {
		fmt.Println(err)
		return 1
	}
	s.Close()
	fmt.Println("served")
	return 0
}

// TestSocketListensBeforeMain: a program started with -kong-prefix DIR
// listens on DIR/<its name>.socket before its main runs, replacing a file
// that is there, and its server takes that socket over.
func TestSocketListensBeforeMain(t *testing.T) {
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, filepath.Base(exe)+".socket")
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(exe, "-kong-prefix", dir).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "served" {
		t.Fatalf("%v: %s", err, out)
	}
}

// TestOnlyTheServingCommandLineOpens: the program alone or -kong-prefix
// DIR (one or two dashes, with = or not) serves; every other command line
// is not for this package.
func TestOnlyTheServingCommandLineOpens(t *testing.T) {
	for _, c := range []struct {
		args   []string
		prefix string
		ok     bool
	}{
		{nil, DefaultKongPrefix, true},
		{[]string{"-kong-prefix", "/k"}, "/k", true},
		{[]string{"--kong-prefix", "/k"}, "/k", true},
		{[]string{"-kong-prefix=/k"}, "/k", true},
		{[]string{"--kong-prefix=/k"}, "/k", true},
		{[]string{"-kong-prefix="}, "", false},
		{[]string{"-kong-prefix", ""}, "", false},
		{[]string{"-dump"}, "", false},
		{[]string{"-dump", "-kong-prefix", "/k"}, "", false},
		{[]string{"-kong-prefix", "/k", "-dump"}, "", false},
		{[]string{"check", "-kong-prefix", "/k"}, "", false},
		{[]string{"keys"}, "", false},
		{[]string{"version"}, "", false},
		{[]string{"-kong-prefix", "/k", "dump"}, "", false},
		{[]string{"dump"}, "", false},
		{[]string{"-help"}, "", false},
	} {
		prefix, ok := servingPrefix(c.args)
		if prefix != c.prefix || ok != c.ok {
			t.Errorf("servingPrefix(%q) = %q, %v; want %q, %v", c.args, prefix, ok, c.prefix, c.ok)
		}
	}
}

// TestTakeGivesTheSocketOnce: Take returns the opened socket for its own
// path, spelled another way too, once; a socket opened for another path
// is closed and not returned.
func TestTakeGivesTheSocketOnce(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.socket")
	fd, err := listen(p)
	if err != nil {
		t.Fatal(err)
	}
	opened, path = fd, p
	f := Take(dir + "//./a.socket")
	if f == nil {
		t.Fatal("Take of the opened socket's path, spelled otherwise: nil")
	}
	f.Close()
	if Take(p) != nil {
		t.Error("Take gave the socket twice")
	}

	if fd, err = listen(p); err != nil {
		t.Fatal(err)
	}
	opened, path = fd, p
	if f := Take(filepath.Join(dir, "b.socket")); f != nil {
		t.Error("Take of another path gave the socket")
	}
	if _, err := net.Dial("unix", p); err == nil {
		t.Error("a socket not taken is still open")
	}
}
