// Package earlysocket opens a Kong plugin server's Unix socket while the
// program is still initializing its packages, before main runs.
//
// Kong 3.9.3 starts a plugin server from a worker's timer and goes on
// serving requests; a request that reaches the plugin before its socket
// exists is answered 500, with no retry
// (kong/runloop/plugin_servers/plugin.lua, get_instance_id). A plugin
// server's packages take about 3 ms to initialize on a 2-vCPU Xeon,
// which doubles the time from Kong's spawn to the socket. Opened here, a
// connection that comes meanwhile waits in the socket's backlog until the
// server accepts it.
//
// It opens the socket only for the command line that serves, as Kong's
// start command gives it: the program alone, or -kong-prefix DIR (or
// -kong-prefix=DIR, with one or two dashes). Anything else (-dump,
// check, keys, a word it does not know) leaves the socket alone, so a
// command run by mistake never takes a live server's socket. Its only
// imports are os and syscall, so it initializes right after them.
package earlysocket

import (
	"os"
	"syscall"
)

// DefaultKongPrefix is the prefix when the command line gives none:
// Kong's own, as go-pdk's -kong-prefix default.
const DefaultKongPrefix = "/usr/local/kong"

var (
	opened = -1 // the listening socket's descriptor; -1: none
	path   string
)

func init() {
	prefix, ok := servingPrefix(os.Args[1:])
	if !ok {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	p := prefix + "/" + base(exe) + ".socket"
	if fd, err := listen(p); err == nil {
		opened, path = fd, p
	}
}

// servingPrefix is the Kong prefix of a command line (the arguments after
// the program) that serves, and false for every other command line.
func servingPrefix(args []string) (string, bool) {
	switch len(args) {
	case 0:
		return DefaultKongPrefix, true
	case 1:
		for _, flag := range []string{"-kong-prefix=", "--kong-prefix="} {
			if len(args[0]) > len(flag) && args[0][:len(flag)] == flag {
				return args[0][len(flag):], true
			}
		}
	case 2:
		if (args[0] == "-kong-prefix" || args[0] == "--kong-prefix") && args[1] != "" {
			return args[1], true
		}
	}
	return "", false
}

func base(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[i+1:]
		}
	}
	return p
}

// listen replaces the socket at p with a listening one, as the server's
// own Listen does (a `kong reload` starts a new server while the old one
// still serves), and returns its descriptor.
func listen(p string) (int, error) {
	if err := syscall.Unlink(p); err != nil && err != syscall.ENOENT {
		return -1, err
	}
	// Package init runs on one goroutine, which forks nothing meanwhile:
	// close-on-exec set after the socket is made is in time.
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		return -1, err
	}
	syscall.CloseOnExec(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: p}); err != nil {
		syscall.Close(fd)
		return -1, err
	}
	if err := syscall.Listen(fd, syscall.SOMAXCONN); err != nil {
		syscall.Close(fd)
		syscall.Unlink(p)
		return -1, err
	}
	return fd, nil
}

// Take returns the socket opened at start if it is the one at p (the
// path as the server names it, which may be spelled otherwise), as an
// *os.File the caller owns, and nil otherwise; a socket opened elsewhere
// is closed. Only the first call can return it.
func Take(p string) *os.File {
	fd, at := opened, path
	opened = -1
	if fd < 0 {
		return nil
	}
	var want, got syscall.Stat_t
	if syscall.Stat(p, &want) != nil || syscall.Stat(at, &got) != nil || want.Dev != got.Dev || want.Ino != got.Ino {
		syscall.Close(fd)
		return nil
	}
	return os.NewFile(uintptr(fd), at)
}
