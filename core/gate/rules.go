package gate

import (
	"fmt"

	"github.com/tollgate/tollgate/core/internal/enum"
)

// The gate's own rules of a config: what a denied request is answered,
// and what a request without a key does. The config package compiles to
// them; the request path trusts them.

// DefaultDenyStatus is the status of a denied request when none is set.
const DefaultDenyStatus = 429

// CheckDenyStatus reports whether status can answer a denied request: a
// 4xx or 5xx code.
func CheckDenyStatus(status int) error {
	if status < 400 || status > 599 {
		return fmt.Errorf("%d is not a 4xx or 5xx code", status)
	}
	return nil
}

// CheckJitter reports whether j, a fraction of Retry-After, is in [0, 1].
func CheckJitter(j float64) error {
	if !(j >= 0 && j <= 1) { // NaN too
		return fmt.Errorf("%g must be between 0 and 1", j)
	}
	return nil
}

// EmptyKey says what a policy does with a request that has no key (every
// placeholder of its key empty, or no identifier).
type EmptyKey uint8

const (
	// EmptyKeyClient keys the request by the client's address instead
	// (the default): leaving the key out (an API key header, say) does not
	// get a client out of the limit. API gateways' own limiters fall back the
	// same way. An adapter that knows no client address counts such
	// requests in the shared bucket.
	EmptyKeyClient EmptyKey = iota
	// EmptyKeySkip lets the request through this policy unlimited.
	EmptyKeySkip
	// EmptyKeyShared counts every keyless request in one shared bucket.
	EmptyKeyShared
)

var emptyKeyNames = []string{EmptyKeyClient: "client", EmptyKeySkip: "skip", EmptyKeyShared: "shared"}

// String returns the configuration name of e.
func (e EmptyKey) String() string { return enum.Name(emptyKeyNames, e, "EmptyKey") }

// ParseEmptyKey reads "client", "skip" or "shared"; "" is client.
func ParseEmptyKey(s string) (EmptyKey, error) {
	if s == "" {
		return EmptyKeyClient, nil
	}
	if e, ok := enum.Parse[EmptyKey](emptyKeyNames, s); ok {
		return e, nil
	}
	return 0, fmt.Errorf("unknown %q (want client, skip or shared)", s)
}
