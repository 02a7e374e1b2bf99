package core

import "fmt"

// enumName returns names[v], or "<typ>(<v>)" for a value without a name.
func enumName[T ~uint8](names []string, v T, typ string) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, v)
}

// parseEnum returns the value whose name is s.
func parseEnum[T ~uint8](names []string, s string) (T, bool) {
	for i, name := range names {
		if name != "" && name == s {
			return T(i), true
		}
	}
	return 0, false
}
