// Package command is a Kong plugin server's command line, the one place
// its flags and subcommands are read. Kong starts a plugin server with
// go-pdk's flags (-kong-prefix, and -dump from its query command), so a
// kong.conf written for any go-pdk server works; operators run `version`
// and `keys`.
package command

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"

	"github.com/tollgate/tollgate/core/admin"
	"github.com/tollgate/tollgate/kongplugin/internal/keys"
	"github.com/tollgate/tollgate/kongplugin/internal/kongschema"
	"github.com/tollgate/tollgate/kongplugin/internal/pluginserver"
)

// DefaultKongPrefix is -kong-prefix's default: Kong's own.
const DefaultKongPrefix = "/usr/local/kong"

// Program is what one plugin server binary serves.
type Program struct {
	// Schema is the plugin's full schema, which -dump prints with Info
	// (go-pdk's own dump has the fields' types only, so Kong would accept
	// any value); Info's Name and Socket are filled here.
	Schema *kongschema.Schema
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
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	prefix := fs.String("kong-prefix", DefaultKongPrefix, "Kong's prefix, where Kong looks for this plugin server's socket")
	dump := fs.Bool("dump", false, "print the plugin's info and schema, as Kong's query command reads them")
	fs.Usage = func() {
		fmt.Fprintf(stderr, `usage:
  %[1]s [-kong-prefix DIR]   serve Kong's plugin protocol on DIR/%[1]s.socket (Kong starts it so)
  %[1]s -dump                print the plugin's info and schema (Kong's query command)
  %[1]s version              print the version
  %[1]s keys ...             read or reset a key's usage (%[1]s keys -h)

flags:
`, name)
		fs.PrintDefaults()
	}
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
		info, schema := p.Info, p.Schema
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
		return 0
	}
	logger := log.New(stderr, "", log.LstdFlags)
	if err := admin.ServeSocket(p.AdminSocket); err != nil {
		logger.Print(err)
		return 1
	}
	err := p.Serve(*prefix, name, socket)
	logger.Print(err)
	return 1
}

// executableName is the plugin's name: its executable's file name, as
// Kong names a Go plugin.
func executableName(args []string) string {
	if exe, err := os.Executable(); err == nil {
		return filepath.Base(exe)
	}
	return filepath.Base(args[0])
}
