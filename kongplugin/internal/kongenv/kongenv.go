// Package kongenv reads the configuration Kong resolved for a prefix: the
// .kong_env file Kong writes there before it starts nginx (and the plugin
// servers), one `name = value` line per setting, lists joined by commas
// and '#' escaped as `\#` (kong/cmd/utils/prefix_handler.lua,
// prepare_prefix).
package kongenv

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// File is the name of the file under Kong's prefix.
const File = ".kong_env"

// Env is Kong's resolved configuration: each setting's value as written.
// A setting Kong left empty is absent.
type Env struct {
	Path   string // the file read
	values map[string]string
}

// Read reads <prefix>/.kong_env. A prefix without one (a plugin server not
// started by Kong) gives a nil Env and no error.
func Read(prefix string) (*Env, error) {
	path := filepath.Join(prefix, File)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	e := &Env{Path: path, values: map[string]string{}}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024) // an inline certificate is a long line
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
			continue
		}
		name, value, ok := strings.Cut(line, " = ")
		if !ok {
			continue
		}
		e.values[strings.TrimSpace(name)] = strings.ReplaceAll(value, `\#`, "#")
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return e, nil
}

// Get returns a setting's value and whether Kong wrote it.
func (e *Env) Get(name string) (string, bool) {
	v, ok := e.values[name]
	return v, ok
}

// List returns a list setting's items ("a,b" -> [a b]), nil when unset.
func (e *Env) List(name string) []string {
	v, ok := e.values[name]
	if !ok {
		return nil
	}
	var out []string
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// Int returns an integer setting, def when unset; an unparsable value is
// an error naming the setting and the file.
func (e *Env) Int(name string, def int) (int, error) {
	v, ok := e.values[name]
	if !ok {
		return def, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return 0, fmt.Errorf("%s = %q in %s is not an integer", name, v, e.Path)
	}
	return n, nil
}
