// Package kongcheck checks what a Kong plugin server needs of the Kong
// that starts it, from the files Kong leaves in its prefix: the settings
// Kong resolved (.kong_env), the user its workers run as (they start the
// plugin servers), the plugin server's start command, and the
// permissions on the prefix where the server makes its socket. Each check
// is one Line: fine, or what is wrong and the fix. `tollgate check` prints
// them, and `-dump` (Kong's query command, which Kong's master runs as
// root at every start) writes the failures to Kong's error log, where
// Kong's default log level shows them: a plugin server's own output
// reaches that log at info only.
package kongcheck

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tollgate/tollgate/kongplugin/internal/kongenv"
)

// Line is one check's verdict.
type Line struct {
	OK bool
	// Warn marks a failure that matters to some configs only (Kong's
	// settings unreadable: policy cluster and Redis ssl_verify need them).
	Warn bool
	Text string // what was checked, and what was found
	Fix  string // for a failure: what to do ("" when OK)
}

func (l Line) String() string {
	if l.OK {
		return "ok    " + l.Text
	}
	s := "FAIL  " + l.Text
	if l.Warn {
		s = "warn  " + l.Text
	}
	if l.Fix != "" {
		s += "\n      fix: " + l.Fix
	}
	return s
}

// Server is the plugin server being checked.
type Server struct {
	// Name is the plugin's name, its executable's file name.
	Name string
	// Prefix is the Kong prefix it was given (-kong-prefix).
	Prefix string
	// ParseFlags reads a start command's arguments (after the program) as
	// the server would; an error is what the server would exit with.
	ParseFlags func(args []string) (kongPrefix string, err error)
}

// Check runs the checks that need no network, in order; it stops early
// where a failure makes the rest meaningless (no .kong_env to read).
func Check(s Server) []Line {
	var out []Line
	envPath := filepath.Join(s.Prefix, kongenv.File)
	env, err := kongenv.Read(s.Prefix)
	switch {
	case err != nil:
		return append(out, Line{Text: "Kong's settings " + envPath + ": " + err.Error(),
			Fix: "run the check as root, or as the user Kong runs as"})
	case env == nil:
		return append(out, Line{Text: "no " + envPath + ": Kong has not started with prefix " + s.Prefix,
			Fix: "give the prefix of kong.conf (prefix = ...) as -kong-prefix, in the start and query commands alike"})
	}
	out = append(out, Line{OK: true, Text: "Kong's settings: " + envPath})

	if role, _ := env.Get("role"); role == "control_plane" {
		return append(out, Line{OK: true, Text: "a hybrid control plane: Kong queries the schema here (-dump) and starts no plugin server"})
	}
	w, line := workers(env, envPath)
	out = append(out, line)
	if w == nil {
		return out
	}
	out = append(out, startCommand(s, env, w)...)
	out = append(out, queryCommand(s, env))
	out = append(out, canMake(w, s.Prefix, filepath.Join(s.Prefix, s.Name+".socket"), "this plugin server's socket"))
	out = append(out, canRead(w, envPath, "policy cluster and Redis ssl_verify read Kong's settings there"))
	return out
}

// worker is the user Kong's workers, and so the plugin servers, run as.
type worker struct {
	name, group string
	uid         int
	gids        []int
}

// workers reads who Kong's workers run as: nginx_user when Kong's master
// runs as root (nobody:nogroup when unset, as Kong 3.9's nginx does),
// else the master's own user, the owner of .kong_env.
func workers(env *kongenv.Env, envPath string) (*worker, Line) {
	fi, err := os.Stat(envPath)
	if err != nil {
		return nil, Line{Text: err.Error()}
	}
	owner := int(fi.Sys().(*syscall.Stat_t).Uid)
	var name, group string
	if owner != 0 {
		u, err := user.LookupId(strconv.Itoa(owner))
		if err != nil {
			return nil, Line{Text: fmt.Sprintf("Kong's master runs as uid %d, which has no name here: %v", owner, err)}
		}
		name = u.Username
	} else {
		name, group = "nobody", "nogroup"
		if v, ok := env.Get("nginx_user"); ok && strings.TrimSpace(v) != "" {
			f := strings.Fields(v)
			name, group = f[0], f[0]
			if len(f) > 1 {
				group = f[1]
			}
		}
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, Line{Text: fmt.Sprintf("Kong's workers run as %s (nginx_user in %s), who does not exist here", name, envPath),
			Fix: "create the user, or set nginx_user in kong.conf to one that exists"}
	}
	w := &worker{name: name}
	w.uid, _ = strconv.Atoi(u.Uid)
	gids, _ := u.GroupIds()
	if group != "" {
		if g, err := user.LookupGroup(group); err == nil {
			gids = append(gids, g.Gid)
		}
	} else if g, err := user.LookupGroupId(u.Gid); err == nil {
		group = g.Name
	}
	w.group = group
	for _, g := range gids {
		if n, err := strconv.Atoi(g); err == nil && !slices.Contains(w.gids, n) {
			w.gids = append(w.gids, n)
		}
	}
	return w, Line{OK: true, Text: fmt.Sprintf("Kong's workers, which start the plugin servers, run as %s:%s", w.name, w.group)}
}

// startCommand checks pluginserver_<name>_start_cmd: there, a program
// the workers may run, flags the server takes, and the prefix Kong
// connects to.
func startCommand(s Server, env *kongenv.Env, w *worker) []Line {
	key := "pluginserver_" + strings.ReplaceAll(s.Name, "-", "_") + "_start_cmd"
	cmd, ok := env.Get(key)
	if !ok {
		if !slices.Contains(env.List("pluginserver_names"), s.Name) {
			return []Line{{Text: "pluginserver_names does not name " + s.Name, Fix: "pluginserver_names = " + s.Name + " and plugins = bundled," + s.Name + " in kong.conf"}}
		}
		return []Line{{OK: true, Text: key + " unset: Kong expects the server to be started by someone else"}}
	}
	args := strings.Fields(cmd)
	program := args[0]
	if program == "/usr/bin/env" { // env NAME=value ... program args
		for len(args) > 1 && (strings.Contains(args[1], "=") || strings.HasPrefix(args[1], "-")) {
			args = args[1:]
		}
		if len(args) > 1 {
			args = args[1:]
			program = args[0]
		}
	}
	var out []Line
	if !strings.Contains(program, "/") { // Kong runs the command with a shell: PATH finds it
		if found, err := exec.LookPath(program); err == nil {
			program = found
		}
	}
	if fi, err := os.Stat(program); err != nil {
		out = append(out, Line{Text: key + ": " + err.Error(), Fix: "the start command's program must exist at that path (Kong reports a missing one as exit 127)"})
	} else if !allows(fi, w, 1) || !searchable(w, filepath.Dir(program)) {
		out = append(out, Line{Text: fmt.Sprintf("%s: %s may not run %s (%s)", key, w.name, program, describe(fi)),
			Fix: "chmod a+rx " + program})
	}
	given, err := s.ParseFlags(args[1:])
	switch {
	case err != nil:
		out = append(out, Line{Text: fmt.Sprintf("%s = %s: the server refuses its arguments: %v", key, cmd, err),
			Fix: fmt.Sprintf("%s = %s -kong-prefix %s", key, program, s.Prefix)})
	case filepath.Clean(given) != filepath.Clean(s.Prefix):
		out = append(out, Line{Text: fmt.Sprintf("%s makes its socket under %s, and Kong connects to %s", key, given, filepath.Join(s.Prefix, s.Name+".socket")),
			Fix: fmt.Sprintf("%s = %s -kong-prefix %s", key, program, s.Prefix)})
	}
	if len(out) == 0 {
		out = append(out, Line{OK: true, Text: key + " = " + cmd})
	}
	return out
}

// queryCommand checks pluginserver_<name>_query_cmd gives -dump the
// prefix: the schema then follows Kong's database (no cluster without
// one), and these checks reach Kong's log at every start.
func queryCommand(s Server, env *kongenv.Env) Line {
	key := "pluginserver_" + strings.ReplaceAll(s.Name, "-", "_") + "_query_cmd"
	cmd, ok := env.Get(key)
	if !ok {
		return Line{OK: true, Text: key + " unset"}
	}
	if f := strings.Fields(cmd); !slices.Contains(f, "-dump") || !slices.Contains(f, "-kong-prefix") {
		return Line{Text: key + " = " + cmd + ": without -dump -kong-prefix, the schema ignores Kong's database and these checks never reach Kong's log",
			Fix: fmt.Sprintf("%s = %s -dump -kong-prefix %s", key, f[0], s.Prefix)}
	}
	return Line{OK: true, Text: key + " = " + cmd}
}

// canMake checks w may create file in dir (write and search on dir,
// search on each directory above it).
func canMake(w *worker, dir, file, what string) Line {
	fi, err := os.Stat(dir)
	if err != nil {
		return Line{Text: err.Error()}
	}
	if allows(fi, w, 3) && searchable(w, filepath.Dir(dir)) {
		return Line{OK: true, Text: fmt.Sprintf("%s may create %s (%s)", w.name, file, what)}
	}
	return Line{Text: fmt.Sprintf("%s may not create %s (%s): %s is %s", w.name, file, what, dir, describe(fi)),
		Fix: fmt.Sprintf("chgrp %s %s && chmod g+ws %s (the group may write there, and files Kong makes there are the group's), or chown %s %s",
			w.group, dir, dir, w.name, dir)}
}

// canRead checks w may read file.
func canRead(w *worker, file, why string) Line {
	fi, err := os.Stat(file)
	if err != nil {
		return Line{Text: err.Error()}
	}
	if allows(fi, w, 4) && searchable(w, filepath.Dir(file)) {
		return Line{OK: true, Text: fmt.Sprintf("%s may read %s", w.name, file)}
	}
	dir := filepath.Dir(file)
	return Line{Warn: true, Text: fmt.Sprintf("%s may not read %s (%s; %s)", w.name, file, describe(fi), why),
		Fix: fmt.Sprintf("chgrp %s %s && chmod g+s %s, then restart Kong: it writes %s again at every start, in the directory's group, readable by the group",
			w.group, dir, dir, filepath.Base(file))}
}

// allows reports whether w has the permission bits want (4 read, 2
// write, 1 search or execute) on fi, as the kernel decides.
func allows(fi fs.FileInfo, w *worker, want fs.FileMode) bool {
	mode := fi.Mode().Perm()
	if w.uid == 0 {
		return want&1 == 0 || fi.IsDir() || mode&0o111 != 0
	}
	st := fi.Sys().(*syscall.Stat_t)
	switch {
	case int(st.Uid) == w.uid:
		return (mode>>6)&want == want
	case slices.Contains(w.gids, int(st.Gid)):
		return (mode>>3)&want == want
	}
	return mode&want == want
}

// searchable reports whether w may pass through dir and each directory
// above it.
func searchable(w *worker, dir string) bool {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || !allows(fi, w, 1) {
			return false
		}
		if d == filepath.Dir(d) {
			return true
		}
	}
}

// describe is a file's mode and owners, as ls shows them.
func describe(fi fs.FileInfo) string {
	st := fi.Sys().(*syscall.Stat_t)
	owner, group := strconv.Itoa(int(st.Uid)), strconv.Itoa(int(st.Gid))
	if u, err := user.LookupId(owner); err == nil {
		owner = u.Username
	}
	if g, err := user.LookupGroupId(group); err == nil {
		group = g.Name
	}
	return fi.Mode().String() + " " + owner + ":" + group
}

// Report appends the failures among lines to Kong's error log, at
// [error] ([warn] for a Warn line), as nginx writes its lines, and
// reports how many it wrote. It
// writes nothing when all is fine or the log cannot be opened (the caller
// is not Kong's master).
func Report(prefix, plugin string, lines []Line, now time.Time) (int, error) {
	env, err := kongenv.Read(prefix)
	if err != nil || env == nil {
		return 0, err
	}
	path, _ := env.Get("proxy_error_log")
	path = strings.TrimSpace(path)
	if path == "" || path == "off" || strings.HasPrefix(path, "syslog:") {
		return 0, nil
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(prefix, path)
	}
	var b strings.Builder
	n := 0
	for _, l := range lines {
		if l.OK {
			continue
		}
		n++
		level := "error"
		if l.Warn {
			level = "warn"
		}
		fmt.Fprintf(&b, "%s [%s] %d#0: [%s] plugin server check: %s", now.Format("2006/01/02 15:04:05"), level, os.Getpid(), plugin, l.Text)
		if l.Fix != "" {
			b.WriteString("; fix: " + l.Fix)
		}
		b.WriteString(" (" + plugin + " check -kong-prefix " + prefix + " shows every check)\n")
	}
	if n == 0 {
		return 0, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			return 0, nil
		}
		return 0, err
	}
	defer f.Close()
	_, err = f.WriteString(b.String()) // one write: lines stay whole beside nginx's
	return n, err
}
