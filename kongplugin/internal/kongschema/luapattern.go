package kongschema

import (
	"fmt"
	"regexp"
	"strings"
)

// luaClasses are Lua's %-classes as POSIX classes (RE2 spells them inside
// brackets); an upper-case letter is the complement.
var luaClasses = map[byte]string{
	'a': "alpha", 'c': "cntrl", 'd': "digit", 'l': "lower", 'p': "punct",
	's': "space", 'u': "upper", 'w': "alnum", 'x': "xdigit",
}

// luaPattern compiles a Lua pattern, as Kong's match validators apply it
// (string.match: unanchored unless ^), to an RE2 regexp. It takes the
// subset schemas use: literals, ., %-classes and escapes, sets, ^ and $
// anchors, and the * + - ? quantifiers. Captures, %b and %f are refused:
// the declaration must not say what this cannot check.
func luaPattern(p string) (*regexp.Regexp, error) {
	var re strings.Builder
	re.WriteString("(?s)")
	i := 0
	if strings.HasPrefix(p, "^") {
		re.WriteString("^")
		i = 1
	}
	for i < len(p) {
		c := p[i]
		switch {
		case c == '$' && i == len(p)-1:
			re.WriteString(`\z`)
			i++
			continue
		case c == '(' || c == ')':
			return nil, fmt.Errorf("lua pattern %q: captures are not supported", p)
		case c == '%':
			if i+1 == len(p) {
				return nil, fmt.Errorf("lua pattern %q: ends with %%", p)
			}
			item, err := luaEscape(p, p[i+1], false)
			if err != nil {
				return nil, err
			}
			re.WriteString(item)
			i += 2
		case c == '[':
			end, item, err := luaSet(p, i)
			if err != nil {
				return nil, err
			}
			re.WriteString(item)
			i = end
		case c == '.':
			re.WriteString(".")
			i++
		default:
			re.WriteString(regexp.QuoteMeta(p[i : i+1]))
			i++
		}
		if i < len(p) {
			switch p[i] {
			case '*', '+', '?':
				re.WriteByte(p[i])
				i++
			case '-':
				re.WriteString("*?")
				i++
			}
		}
	}
	return regexp.Compile(re.String())
}

// luaEscape translates %c; inSet renders a class without its brackets.
func luaEscape(p string, c byte, inSet bool) (string, error) {
	lower := c | 0x20
	if class, ok := luaClasses[lower]; ok && (c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
		if c != lower {
			class = "^" + class
		}
		if inSet {
			return "[:" + class + ":]", nil
		}
		return "[[:" + class + ":]]", nil
	}
	if c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' {
		return "", fmt.Errorf("lua pattern %q: %%%c is not supported", p, c)
	}
	return `\` + string(c), nil
}

// luaSet translates the set opening at p[start] and returns where it ends.
func luaSet(p string, start int) (int, string, error) {
	var set strings.Builder
	set.WriteString("[")
	i := start + 1
	if i < len(p) && p[i] == '^' {
		set.WriteString("^")
		i++
	}
	for first := true; i < len(p); first = false {
		c := p[i]
		switch {
		case c == ']' && !first:
			return i + 1, set.String() + "]", nil
		case c == '%' && i+1 < len(p):
			item, err := luaEscape(p, p[i+1], true)
			if err != nil {
				return 0, "", err
			}
			set.WriteString(item)
			i += 2
		case i+2 < len(p) && p[i+1] == '-' && p[i+2] != ']':
			set.WriteString(setLiteral(c) + "-" + setLiteral(p[i+2]))
			i += 3
		default:
			set.WriteString(setLiteral(c))
			i++
		}
	}
	return 0, "", fmt.Errorf("lua pattern %q: unclosed set", p)
}

// setLiteral is c as a literal inside an RE2 set: punctuation escaped,
// letters and digits as they are (a backslash would make \d a class).
func setLiteral(c byte) string {
	if c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' {
		return string(c)
	}
	return `\` + string(c)
}
