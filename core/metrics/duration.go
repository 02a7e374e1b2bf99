package metrics

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// durationBuckets are tollgate_store_duration_seconds' upper bounds: 10 µs
// to 1 s, each inclusive, as Prometheus's le.
var durationBuckets = [...]time.Duration{
	10 * time.Microsecond, 50 * time.Microsecond, 100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond,
	50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second,
}

// durationVec is a histogram of durations by policy, exposed as
// client_golang's HistogramVec with the same buckets is. It is observed on
// every decision: an observation is a bucket's atomic add and the sum's, in
// integer nanoseconds, where client_golang's takes four atomic operations
// and a compare-and-swap loop on a float.
type durationVec struct {
	desc     *prometheus.Desc
	mu       sync.Mutex
	byPolicy map[string]*durationHistogram
}

func newDurationVec(name, help string) *durationVec {
	return &durationVec{
		desc:     prometheus.NewDesc(name, help, []string{"policy"}, nil),
		byPolicy: map[string]*durationHistogram{},
	}
}

// forPolicy returns policy's histogram, made on first use.
func (v *durationVec) forPolicy(policy string) *durationHistogram {
	v.mu.Lock()
	defer v.mu.Unlock()
	h := v.byPolicy[policy]
	if h == nil {
		h = &durationHistogram{policy: policy}
		v.byPolicy[policy] = h
	}
	return h
}

func (v *durationVec) Describe(ch chan<- *prometheus.Desc) { ch <- v.desc }

func (v *durationVec) Collect(ch chan<- prometheus.Metric) {
	v.mu.Lock()
	histograms := make([]*durationHistogram, 0, len(v.byPolicy))
	for _, h := range v.byPolicy {
		histograms = append(histograms, h)
	}
	v.mu.Unlock()
	for _, h := range histograms {
		ch <- h.metric(v.desc)
	}
}

// durationHistogram is one policy's series of a durationVec.
type durationHistogram struct {
	policy   string
	counts   [len(durationBuckets) + 1]atomic.Uint64 // per bucket, not cumulative; the last is +Inf's own
	sumNanos atomic.Int64
}

// observe counts one duration.
func (h *durationHistogram) observe(d time.Duration) {
	i := 0
	for i < len(durationBuckets) && d > durationBuckets[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sumNanos.Add(int64(d))
}

// metric is the histogram as it stands. Its count is the sum of the bucket
// counts read, so the +Inf bucket and the count always agree; an
// observation landing during the read may be in the sum and not yet in
// its bucket, or the other way round.
func (h *durationHistogram) metric(desc *prometheus.Desc) prometheus.Metric {
	buckets := make(map[float64]uint64, len(durationBuckets))
	var cumulative uint64
	for i, bound := range durationBuckets {
		cumulative += h.counts[i].Load()
		buckets[bound.Seconds()] = cumulative
	}
	cumulative += h.counts[len(durationBuckets)].Load()
	sum := time.Duration(h.sumNanos.Load()).Seconds()
	return prometheus.MustNewConstHistogram(desc, cumulative, sum, buckets, h.policy)
}
