// Package command is a Kong plugin server's command line, the one place
// its flags and subcommands are read. Kong starts a plugin server with
// go-pdk's flags (-kong-prefix, and -dump from its query command), so a
// kong.conf written for any go-pdk server works; operators run `version`,
// `keys` and `check`.
package command

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/tollgate/tollgate/core/admin"
	"github.com/tollgate/tollgate/kongplugin/internal/earlysocket"
	"github.com/tollgate/tollgate/kongplugin/internal/keys"
	"github.com/tollgate/tollgate/kongplugin/internal/kongcheck"
	"github.com/tollgate/tollgate/kongplugin/internal/kongschema"
	"github.com/tollgate/tollgate/kongplugin/internal/pluginserver"
)

// DefaultKongPrefix is -kong-prefix's default: Kong's own, where the
// socket opened as the program starts (earlysocket) goes too.
const DefaultKongPrefix = earlysocket.DefaultKongPrefix

// Program is what one plugin server binary serves.
type Program struct {
	// Schema returns the plugin's full schema, which -dump prints with
	// Info (go-pdk's own dump has the fields' types only, so Kong would
	// accept any value); Info's Name and Socket are filled here. Serving
	// does not call it: a server listens before it parses a schema.
	Schema func() *kongschema.Schema
	Info   kongschema.Info
	// Serve serves Kong's plugin protocol for the plugin named name on
	// socket, for the Kong whose prefix is prefix; it returns when the
	// server fails.
	Serve func(prefix, name, socket string) error
	// Keys compiles a plugin config for the keys command, for the Kong
	// whose prefix is kongPrefix ("": none).
	Keys func(kongPrefix string, config []byte) (keys.Target, error)
	// AdminSocket is the operators' API's Unix socket ("": none).
	AdminSocket string
	// Check, if set, makes the checks of `check` that reach beyond the
	// prefix's files (Kong's database; with a plugin's config, its
	// store), for the Kong whose prefix it is; plugin is nil without one.
	Check func(kongPrefix string, plugin []byte) []kongcheck.Line
}

// Main runs the command line args (os.Args: the program, then its
// arguments) and returns the exit status: `version` prints the version;
// `keys ...` is the operators' command (keys.Run); -dump prints the
// plugin's info and schema, as Kong's query command reads them; otherwise
// it serves the operators' API on p.AdminSocket and Kong's plugin
// protocol on <-kong-prefix>/<name>.socket, Kong naming a Go plugin after
// its executable. A flag, subcommand or argument it does not know exits 2
// with the usage, before anything opens.
func Main(args []string, p Program, stdout, stderr io.Writer) int {
	if len(args) > 1 {
		switch args[1] {
		case "version", "-version", "--version":
			fmt.Fprintln(stdout, p.Info.Version)
			return 0
		case "check":
			return check(executableName(args), args[2:], p, stdout, stderr)
		case "keys":
			return keys.Run(args[2:], stdout, stderr, func(kongPrefix string, b []byte) (keys.Target, error) {
				config, err := kongschema.PluginConfig(b)
				if err != nil {
					return keys.Target{}, err
				}
				return p.Keys(kongPrefix, config)
			})
		}
	}
	name := executableName(args)
	fs, prefix, dump := serverFlags(name, stderr)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		// A word it does not know (dump, key) must not start a server:
		// it would take the socket of the one Kong runs.
		fmt.Fprintf(stderr, "%s: unknown subcommand or argument %q\n", name, fs.Arg(0))
		fs.Usage()
		return 2
	}
	socket := pluginserver.SocketPath(*prefix, name)
	if *dump {
		info, schema := p.Info, p.Schema()
		info.Name, info.Socket = name, socket
		given := false
		fs.Visit(func(f *flag.Flag) { given = given || f.Name == "kong-prefix" })
		if given && info.ForKong != nil {
			var err error
			if schema, err = info.ForKong(*prefix); err != nil {
				fmt.Fprintf(stderr, "%s: %v\n", name, err)
				return 1
			}
		}
		if err := schema.Dump(stdout, info); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", name, err)
			return 1
		}
		if given {
			// Kong's master runs the query command as root at every start:
			// what would stop the server is said in Kong's error log, where
			// its default level shows it (the server's own output reaches
			// that log at info only).
			if _, err := kongcheck.Report(*prefix, name, kongcheck.Check(checked(name, *prefix)), time.Now()); err != nil {
				fmt.Fprintf(stderr, "%s: telling Kong's log what the checks found: %v\n", name, err)
			}
		}
		return 0
	}
	logger := log.New(stderr, "", log.LstdFlags)
	if err := admin.ServeSocket(p.AdminSocket); err != nil {
		logger.Print(err)
		return 1
	}
	err := p.Serve(*prefix, name, socket)
	logger.Printf("%v (%s check -kong-prefix %s says what this server needs of Kong, and the fix)", err, name, *prefix)
	return 1
}

// serverFlags are the server's own flags (go-pdk's): what Kong's start
// and query commands give it.
func serverFlags(name string, stderr io.Writer) (fs *flag.FlagSet, prefix *string, dump *bool) {
	fs = flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	prefix = fs.String("kong-prefix", DefaultKongPrefix, "Kong's prefix, where Kong looks for this plugin server's socket")
	dump = fs.Bool("dump", false, "print the plugin's info and schema, as Kong's query command reads them")
	fs.Usage = func() {
		fmt.Fprintf(stderr, `usage:
  %[1]s [-kong-prefix DIR]        serve Kong's plugin protocol on DIR/%[1]s.socket (Kong starts it so)
  %[1]s -dump [-kong-prefix DIR]  print the plugin's info and schema (Kong's query command)
  %[1]s check [-kong-prefix DIR] [-plugin FILE]
                                 check what this server needs of the Kong at DIR (and of a plugin's Redis), each line ok or the fix
  %[1]s version                   print the version
  %[1]s keys ...                  read or reset a key's usage (%[1]s keys -h)

flags:
`, name)
		fs.PrintDefaults()
	}
	return fs, prefix, dump
}

// checked is the server kongcheck checks: name, serving for the Kong at
// prefix, reading a start command's arguments as Main does.
func checked(name, prefix string) kongcheck.Server {
	return kongcheck.Server{Name: name, Prefix: prefix, ParseFlags: func(args []string) (string, error) {
		fs, given, dump := serverFlags(name, io.Discard)
		if err := fs.Parse(args); err != nil {
			return "", err
		}
		switch {
		case fs.NArg() > 0:
			return "", fmt.Errorf("unknown subcommand or argument %q", fs.Arg(0))
		case *dump:
			return "", errors.New("-dump prints the schema and exits: it serves nothing")
		}
		return *given, nil
	}}
}

// check runs `check [-kong-prefix DIR] [-plugin FILE]`: every check,
// one line each, and exit status 1 when one fails.
func check(name string, args []string, p Program, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(name+" check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	prefix := fs.String("kong-prefix", DefaultKongPrefix, "Kong's prefix (kong.conf's prefix)")
	pluginFile := fs.String("plugin", "", "a plugin as Kong's Admin API returns it (GET /plugins/{id}), or its config: reach its Redis too")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s check: unknown argument %q (flags only: -kong-prefix DIR, -plugin FILE)\n", name, fs.Arg(0))
		return 2
	}
	var plugin []byte
	if *pluginFile != "" {
		b, err := os.ReadFile(*pluginFile)
		if err == nil {
			plugin, err = kongschema.PluginConfig(b)
		}
		if err != nil {
			fmt.Fprintf(stderr, "%s check: -plugin %s: %v\n", name, *pluginFile, err)
			return 2
		}
	}
	lines := kongcheck.Check(checked(name, *prefix))
	if p.Check != nil && (len(lines) == 0 || lines[0].OK) {
		lines = append(lines, p.Check(*prefix, plugin)...)
	}
	failed, warned := 0, 0
	for _, l := range lines {
		fmt.Fprintln(stdout, l)
		switch {
		case l.Warn:
			warned++
		case !l.OK:
			failed++
		}
	}
	switch {
	case failed > 0:
		fmt.Fprintf(stdout, "%d of %d checks failed\n", failed, len(lines))
		return 1
	case warned > 0:
		fmt.Fprintf(stdout, "%d of %d checks passed, %d with a warning\n", len(lines)-warned, len(lines), warned)
		return 0
	}
	fmt.Fprintf(stdout, "all %d checks passed\n", len(lines))
	return 0
}

// executableName is the plugin's name: its executable's file name, as
// Kong names a Go plugin.
func executableName(args []string) string {
	if exe, err := os.Executable(); err == nil {
		return filepath.Base(exe)
	}
	return filepath.Base(args[0])
}
