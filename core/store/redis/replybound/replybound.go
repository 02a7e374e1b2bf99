// Package replybound checks what a Redis reply claims before a client
// reads it. go-redis allocates an aggregate's elements and a bulk string's
// bytes as soon as it reads their header, so a server (or anything between
// it and the gateway) that claims 2^31 elements would make the gateway
// allocate them: Dialer's connections fail such a reply instead, so the
// call fails as on any broken connection.
package replybound

import (
	"context"
	"fmt"
	"net"
	"strconv"
)

// The bounds: far above the largest reply the Redis store can need (a
// batch of decisions, each denied on sliding logs carrying their live
// times, sizes its batches by MaxElements), far below what hurts a
// gateway.
const (
	// MaxElements bounds an aggregate's count (array, set, map pairs,
	// push): 65,536.
	MaxElements = 1 << 16
	// MaxBulk bounds a bulk string (or blob error, verbatim string) in
	// bytes: 1 MiB, above CLUSTER NODES of a thousand-node cluster.
	MaxBulk = 1 << 20
	// MaxLine bounds a reply's header or simple line in bytes.
	MaxLine = 64 << 10
)

// Dialer wraps dial so that every connection's replies are checked
// against the bounds as they arrive.
func Dialer(dial func(context.Context, string, string) (net.Conn, error)) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &boundedConn{Conn: c}, nil
	}
}

// boundedConn passes Redis's bytes on only after checking each reply
// header in them (RESP2 and RESP3) against the bounds. A header that claims
// more fails the read, before go-redis has seen the header's line end, so
// go-redis closes the connection and the call fails as on any broken
// connection: the store's failure policy answers.
type boundedConn struct {
	net.Conn
	bounds replyBounds
}

func (c *boundedConn) Read(p []byte) (int, error) {
	if c.bounds.failed != nil { // go-redis may read again before it closes the connection
		return 0, c.bounds.failed
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		if berr := c.bounds.scan(p[:n]); berr != nil {
			return 0, berr
		}
	}
	return n, err
}

// headBytes is how much of a line replyBounds keeps: more than the
// longest number a bound needs, with its sign and CR.
const headBytes = 24

// replyBounds scans a stream of RESP replies: header and simple lines are
// read, bulk payloads skipped by their length.
type replyBounds struct {
	skip    int64           // payload bytes (and CRLF) still to skip
	lineLen int             // bytes of the current line so far
	head    [headBytes]byte // the current line's first bytes
	failed  error
}

func (b *replyBounds) scan(p []byte) error {
	if b.failed != nil {
		return b.failed
	}
	for i := 0; i < len(p); {
		if b.skip > 0 {
			step := min(b.skip, int64(len(p)-i))
			b.skip -= step
			i += int(step)
			continue
		}
		c := p[i]
		i++
		if c != '\n' {
			if b.lineLen < len(b.head) {
				b.head[b.lineLen] = c
			}
			b.lineLen++
			if b.lineLen > MaxLine {
				return b.fail(fmt.Errorf("redis: a reply line longer than %d bytes", MaxLine))
			}
			continue
		}
		line, full := b.head[:min(b.lineLen, len(b.head))], b.lineLen
		b.lineLen = 0
		if err := b.header(line, full); err != nil {
			return b.fail(err)
		}
	}
	return nil
}

func (b *replyBounds) fail(err error) error {
	b.failed = err
	return err
}

// header checks one complete line: its first bytes (its CR included, if
// any) and its whole length. Only the lines that claim a length or a count
// are read as numbers: a decision's reply is mostly integer lines, and
// making each a string would cost an allocation.
func (b *replyBounds) header(line []byte, full int) error {
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	if len(line) == 0 {
		return fmt.Errorf("redis: an empty reply line")
	}
	kind, digits := line[0], line[1:]
	switch kind {
	case '$', '!', '=': // bulk string, blob error, verbatim string
		n, ok := number(digits, full)
		if !ok || n < -1 {
			return fmt.Errorf("redis: a reply of type %q with length %q", kind, shown(digits, full))
		}
		if n > MaxBulk {
			return fmt.Errorf("redis: a reply claims %d bytes, more than the %d a rate limiter reads", n, MaxBulk)
		}
		if n >= 0 {
			b.skip = n + 2
		}
	case '*', '%', '~', '>', '|': // array, map, set, push, attribute
		n, ok := number(digits, full)
		if !ok || n < -1 {
			return fmt.Errorf("redis: a reply of type %q with count %q", kind, shown(digits, full))
		}
		if n > MaxElements {
			return fmt.Errorf("redis: a reply claims %d elements, more than the %d a rate limiter reads", n, MaxElements)
		}
	}
	return nil
}

// number reads a header line's decimal number from its digits, the line
// full bytes long in all; false when they are none, or more than any
// bound needs (only the line's first headBytes are kept).
func number(digits []byte, full int) (int64, bool) {
	if full > headBytes {
		return 0, false
	}
	// (A string made only to be parsed is not kept: no allocation.)
	n, err := strconv.ParseInt(string(digits), 10, 64)
	return n, err == nil
}

// shown is how an error quotes a header line's digits.
func shown(digits []byte, full int) string {
	if full > headBytes {
		return "(a number of more than 20 digits)" // no bound's length needs one
	}
	return string(digits)
}
