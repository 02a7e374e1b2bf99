package kongschema

import (
	"fmt"
	"strings"

	"github.com/yuin/gopher-lua/pm"
)

// luaPattern is a Lua pattern as Kong's match validators apply it
// (unanchored unless it starts with ^), matched by gopher-lua's port of
// Lua 5.1's matcher (github.com/yuin/gopher-lua/pm) rather than a
// translation to another regexp language.
type luaPattern string

// compileLuaPattern checks that p is a well-formed Lua pattern.
func compileLuaPattern(p string) (luaPattern, error) {
	trailing := len(p) - len(strings.TrimRight(p, "%"))
	if trailing%2 == 1 { // Lua refuses it; gopher-lua reads it as a literal %
		return "", fmt.Errorf("lua pattern %q: malformed pattern (ends with '%%')", p)
	}
	if _, err := pm.Find(p, nil, 0, 1); err != nil {
		return "", fmt.Errorf("lua pattern %q: %v", p, err)
	}
	return luaPattern(p), nil
}

// MatchString reports whether s holds a match of p, as string.find does.
func (p luaPattern) MatchString(s string) bool {
	m, err := pm.Find(string(p), []byte(s), 0, 1)
	return err == nil && len(m) > 0
}
