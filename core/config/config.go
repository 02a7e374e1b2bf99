package config

import (
	"fmt"
)

// The checks of options every adapter offers, written once. Their messages
// name the value, not the field: each adapter prefixes its own name and
// location (a config file's line, a field path).

// CheckCost reports whether cost, the units one request takes, is usable.
func CheckCost(cost int64) error {
	if cost < 0 {
		return fmt.Errorf("%d must not be negative", cost)
	}
	return nil
}
