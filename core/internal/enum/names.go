package enum

import "fmt"

// Name returns names[v], or "<typ>(<v>)" for a value without a name.
func Name[T ~uint8](names []string, v T, typ string) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, v)
}

// Parse returns the value whose name is s.
func Parse[T ~uint8](names []string, s string) (T, bool) {
	for i, name := range names {
		if name != "" && name == s {
			return T(i), true
		}
	}
	return 0, false
}
