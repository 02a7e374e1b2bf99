package core

import (
	"fmt"

	"github.com/tollgate/tollgate/core/internal/enum"
)

// OnError says what a store's failure policy does with a request its shared store
// could not decide (Redis down, slow or failing over).
type OnError uint8

const (
	// OnErrorLocal decides on this node's fallback store with the same limits
	// (the default): requests keep flowing and each node still limits.
	OnErrorLocal OnError = iota
	// OnErrorAllow lets every request through until the store is back.
	OnErrorAllow
	// OnErrorDeny refuses every request until the store is back.
	OnErrorDeny
	// OnErrorFail returns the store's error to the caller (an adapter answers 500).
	OnErrorFail
)

var onErrorNames = []string{OnErrorLocal: "local", OnErrorAllow: "allow", OnErrorDeny: "deny", OnErrorFail: "fail"}

// String returns the configuration name of o.
func (o OnError) String() string { return enum.Name(onErrorNames, o, "OnError") }

// ParseOnError reads "local", "allow", "deny" or "fail".
func ParseOnError(s string) (OnError, error) {
	if o, ok := enum.Parse[OnError](onErrorNames, s); ok {
		return o, nil
	}
	return 0, fmt.Errorf("on_error: unknown value %q (want local, allow, deny or fail)", s)
}
