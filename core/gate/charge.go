package gate

import (
	"context"
	"net/http"
	"strings"

	"github.com/tollgate/tollgate/core"
	"github.com/tollgate/tollgate/core/usage"
)

// Charges reports whether the request's response is to be charged to a
// rule's limits (see Charge).
func (p *Outcome) Charges() bool { return len(p.charges) > 0 }

// Charge charges each rule whose limits are charged after the response
// what the response, of status and with the headers header reads, costs
// (its Rule.Charge), in one store round trip per rule, even when the
// client has left. Decision then shows the most restrictive of what it
// showed and the charged limits as they are after the charge (allowed,
// since this response is already on its way: an overdrawn limit shows 0
// remaining, and refuses the next request with its Retry-After). It
// returns the first store error; a rule whose store failed is not charged.
func (p *Outcome) Charge(ctx context.Context, status int, header func(name string) string) error {
	return p.ChargeEach(ctx, status, header, nil)
}

// ChargeEach is Charge, and tells charged (when not nil) each rule's
// policy and its limits as they are after the charge; d is valid only
// during the call. A rule the response costs nothing is not charged, and
// not told. A rule that charges the tokens the body reports
// (ResponseCost.Usage) is only chosen here, by the response's status
// and headers: ChargeBody charges it once the body has ended.
func (p *Outcome) ChargeEach(ctx context.Context, status int, header func(name string) string, charged func(policy *core.Policy, d *core.Decision)) error {
	pending := p.charges[:0]
	var first error
	for _, c := range p.charges {
		cost, ok := c.cost.Cost(status, header)
		switch {
		case !ok:
		case c.cost.Usage != usage.None:
			pending = append(pending, c)
		default:
			if err := p.charge(ctx, &c, cost, charged); err != nil && first == nil {
				first = err
			}
		}
	}
	p.charges = pending
	return first
}

// ChargesBody reports whether a rule waits for the response's body to
// end to charge the tokens it reports (see ChargeBody).
func (p *Outcome) ChargesBody() bool {
	for i := range p.charges {
		if p.charges[i].cost.Usage != usage.None {
			return true
		}
	}
	return false
}

// ChargeBody charges each rule that Charge left waiting for the body what
// the body reported (u; found false when it reported nothing: each rule's
// ResponseCost.Fixed), as Charge does. Call it once the body has ended,
// or was cut short.
func (p *Outcome) ChargeBody(ctx context.Context, u usage.Usage, found bool) error {
	var first error
	for i := range p.charges {
		c := &p.charges[i]
		if c.cost.Usage == usage.None {
			continue // priced by its status and headers: Charge's
		}
		p.unreported = p.unreported || !found
		if err := p.charge(ctx, c, c.cost.BodyCost(u, found), nil); err != nil && first == nil {
			first = err
		}
	}
	p.charges = nil
	return first
}

// UsageUnreported reports whether ChargeBody charged a rule that waited
// for the body's usage its ResponseCost.Fixed, because the body reported
// none (an error page, a compressed answer, a stream cut short or whose
// client did not ask for its usage): what an operator is told, since a
// budget then counts an estimate, not the tokens spent.
func (p *Outcome) UsageUnreported() bool { return p.unreported }

// charge charges rule c cost units and shows what it left (see Charge).
func (p *Outcome) charge(ctx context.Context, c *heldCharge, cost int64, charged func(policy *core.Policy, d *core.Decision)) error {
	d := decisions.Get().(*core.Decision)
	defer decisions.Put(d)
	if err := c.limiter.DecideFor(context.WithoutCancel(ctx), c.twin, c.key, cost, d); err != nil {
		return err
	}
	d.Allowed, d.Shadowed, d.RetryAfter = true, false, 0
	if charged != nil {
		charged(c.policy, d)
	}
	if p.Decision.Policy == c.policy || core.MoreRestrictive(d, &p.Decision) {
		p.Decision, p.Key = *d, c.key
	}
	return nil
}

// ServeCharged runs serve with a writer that charges the response (see
// Charge) when its status is written, and sets the rate-limit headers
// again from what the charge left, before the status goes out. A rule
// that charges the tokens the body reports reads them as the body streams
// through (a usage.Scanner: nothing held back, nothing kept) and is
// charged when serve returns (ChargeBody). serve returns the status of a
// response it did not write (an error a later handler returned), or 0; a
// response it never wrote is charged as 200. A serve that panics (a proxy
// aborting a response whose upstream died mid-body panics with
// http.ErrAbortHandler) is charged all the same, a response it never
// began as 502, before the panic goes on. It returns the first charge's
// error.
func (g *Gate) ServeCharged(ctx context.Context, p *Outcome, w http.ResponseWriter, serve func(w http.ResponseWriter) (failed int)) (err error) {
	cw := &chargeWriter{ResponseWriter: w, ctx: ctx, gate: g, outcome: p}
	failed, returned := 0, false
	defer func() {
		if !cw.charged {
			status := http.StatusOK
			if failed != 0 {
				status = failed
			} else if !returned {
				status = http.StatusBadGateway
			}
			cw.charge(status)
		}
		if cw.scan != nil {
			u, found := cw.scan.Usage()
			if err := p.ChargeBody(ctx, u, found); cw.err == nil {
				cw.err = err
			}
		}
		err = cw.err
	}()
	failed = serve(cw)
	returned = true
	return nil
}

// chargeWriter charges the response when its final status is written,
// and reads the usage its body reports when a rule waits for it.
type chargeWriter struct {
	http.ResponseWriter
	ctx     context.Context
	gate    *Gate
	outcome *Outcome
	charged bool
	err     error
	scan    *usage.Scanner // nil unless a rule charges the body's usage
}

func (c *chargeWriter) charge(status int) {
	c.charged = true
	c.err = c.outcome.Charge(c.ctx, status, func(name string) string {
		return JoinFieldLines(c.ResponseWriter.Header().Values(name))
	})
	c.gate.WriteHeaders(c.ResponseWriter.Header(), c.outcome)
	if c.outcome.ChargesBody() {
		c.scan = usage.NewScanner(c.ResponseWriter.Header().Get("Content-Type"))
	}
}

// WriteHeader charges the response at its first final (non-1xx) status.
func (c *chargeWriter) WriteHeader(code int) {
	if !c.charged && code >= 200 {
		c.charge(code)
	}
	c.ResponseWriter.WriteHeader(code)
}

// Write charges a response whose status was not written as 200, and
// passes b on, reading it for usage too when a rule waits for it.
func (c *chargeWriter) Write(b []byte) (int, error) {
	if !c.charged {
		c.charge(http.StatusOK)
	}
	n, err := c.ResponseWriter.Write(b)
	if c.scan != nil {
		_, _ = c.scan.Write(b[:n])
	}
	return n, err
}

// Flush sends what was written so far (a 200 when nothing was).
func (c *chargeWriter) Flush() {
	if !c.charged {
		c.charge(http.StatusOK)
	}
	_ = http.NewResponseController(c.ResponseWriter).Flush()
}

// Unwrap returns the writer underneath, for http.ResponseController.
func (c *chargeWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// JoinFieldLines reads every line of a repeated header as one field, as
// RFC 9110 section 5.3 combines them: the values joined by ", ". Every
// adapter reads a response's cost header so.
func JoinFieldLines(lines []string) string { return strings.Join(lines, ", ") }
