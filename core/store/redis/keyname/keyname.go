// Package keyname names the Redis store's keys. A key's state under a
// policy lives in a hash "<prefix>{<policy>:<key>}", one field per limit,
// and each sliding_log or in_flight limit's times in a sorted set beside
// it, "<prefix>{<policy>:<key>}:<limit id>". The braces are a Cluster hash
// tag, so a request's keys share one slot and one script touches them all.
package keyname

import (
	"strings"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/algo"
)

// State names the hash of key's state under p, for a store whose keys
// start with prefix.
func State(prefix string, p *core.Policy, key string) string {
	var b [128]byte // the usual name fits: one allocation, the string's
	return string(AppendState(b[:0], prefix, p, key))
}

// AppendState appends State(prefix, p, key) to b.
func AppendState(b []byte, prefix string, p *core.Policy, key string) []byte {
	name := p.Name()
	b = append(append(b, prefix...), '{')
	if strings.ContainsAny(name, "%}") || strings.ContainsAny(key, "%}") {
		b = append(b, tagEscaper.Replace(name+":"+key)...)
	} else {
		b = append(append(append(b, name...), ':'), key...)
	}
	return append(b, '}')
}

// tagEscaper escapes what would end a Cluster hash tag early: a "}" in a
// key would make the tag the text before it, so a client could pick the
// slot its counters land in, and its keys "a}1", "a}2", ... would all land
// in one. "%" is escaped too, so two keys never share a name.
var tagEscaper = strings.NewReplacer("%", "%25", "}", "%7D")

// Limit names limit i's own key beside the state hash named hash.
func Limit(hash string, p *core.Policy, i int) string {
	return hash + ":" + p.StoreSide().LimitID(i)
}

// sorted reports whether a limit of algorithm a keeps a sorted set.
func sorted(a algo.Algorithm) bool { return a == algo.SlidingLog || a == algo.InFlight }

// Decision is the keys a decision's script reads, as command arguments:
// the hash, then the sorted sets of the policy's sliding_log and in_flight
// limits alone. Their names lie one after another in names, and each goes
// to go-redis as an Arg, which it writes as it is (an
// encoding.BinaryMarshaler); a pointer goes into an interface without an
// allocation, where a string would take one. Set again, a Decision reuses
// its memory, so one kept with a pooled call costs a decision nothing.
type Decision struct {
	names []byte
	args  []Arg
}

// Arg is one key of a Decision.
type Arg struct {
	name []byte
	end  int // where name ends in its Decision's names
}

// MarshalBinary returns the key's name, which the caller must not change.
func (a *Arg) MarshalBinary() ([]byte, error) { return a.name, nil }

// Set makes d the keys of a decision for key under p, for a store whose
// keys start with prefix.
func (d *Decision) Set(prefix string, p *core.Policy, key string) {
	d.names = AppendState(d.names[:0], prefix, p, key)
	hash := len(d.names)
	d.args = append(d.args[:0], Arg{end: hash})
	for i := range p.Limits() {
		if sorted(p.Limits()[i].Algorithm) {
			// As Limit names it.
			d.names = append(d.names, d.names[:hash]...)
			d.names = append(append(d.names, ':'), p.StoreSide().LimitID(i)...)
			d.args = append(d.args, Arg{end: len(d.names)})
		}
	}
	// Only now, d.names written whole, can each key point into it.
	from := 0
	for i := range d.args {
		d.args[i].name = d.names[from:d.args[i].end:d.args[i].end]
		from = d.args[i].end
	}
}

// Len is how many keys d holds.
func (d *Decision) Len() int { return len(d.args) }

// Arg returns d's key i, valid until d is set again.
func (d *Decision) Arg(i int) *Arg { return &d.args[i] }

// Strings returns d's keys as strings.
func (d *Decision) Strings() []string {
	keys := make([]string, len(d.args))
	for i := range d.args {
		keys[i] = string(d.args[i].name)
	}
	return keys
}
