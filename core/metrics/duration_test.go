package metrics

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/tollgate/tollgate/internal/benchkeys"
)

// TestDurationVecExposesWhatClientGolangWould: the same durations observed
// by durationVec and by client_golang's HistogramVec with the same name,
// help and buckets gather to the same text, bucket edges included (a
// bound is inclusive, as le says), and each policy is its own series.
func TestDurationVecExposesWhatClientGolangWould(t *testing.T) {
	const name, help = "tollgate_store_duration_seconds", "Time the store took to decide one request, in seconds."
	theirs := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: bucketSeconds()}, []string{"policy"})
	ours := newDurationVec(name, help)
	observed := []time.Duration{0, time.Nanosecond, 9 * time.Microsecond, 10 * time.Microsecond, 10*time.Microsecond + 1,
		250 * time.Microsecond, 3 * time.Millisecond, 500 * time.Millisecond, time.Second, time.Second + 1, 7 * time.Second}
	for i, d := range observed {
		policy := []string{"api", "login"}[i%2]
		theirs.WithLabelValues(policy).Observe(d.Seconds())
		ours.forPolicy(policy).observe(d)
	}
	ours.forPolicy("unused") // a policy that decided nothing has its series, at 0
	theirs.WithLabelValues("unused")
	want := gatherText(t, theirs)
	if err := testutil.CollectAndCompare(ours, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	// 10 µs exactly (login's) is within le="1e-05"; 10 µs and 1 ns (api's) is not.
	if !strings.Contains(want, `tollgate_store_duration_seconds_bucket{policy="login",le="1e-05"} 2`) ||
		!strings.Contains(want, `tollgate_store_duration_seconds_bucket{policy="api",le="1e-05"} 2`) {
		t.Errorf("the reference text is not what this test means it to be:\n%s", want)
	}
}

// bucketSeconds are durationBuckets as client_golang takes them.
func bucketSeconds() []float64 {
	bounds := make([]float64, len(durationBuckets))
	for i, d := range durationBuckets {
		bounds[i] = d.Seconds()
	}
	return bounds
}

// gatherText is c's series in the text exposition format.
func gatherText(t *testing.T, c prometheus.Collector) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for _, f := range families {
		if _, err := expfmt.MetricFamilyToText(&buf, f); err != nil {
			t.Fatal(err)
		}
	}
	return buf.String()
}

// BenchmarkObserveVsClientGolang measures one decision's latency counted
// in its policy's histogram against client_golang's HistogramVec child
// with the same buckets: 30 rounds of 1,000,000 observations that
// alternate the two (benchkeys.Interleaved). It prints `vs client_golang
// histogram-observe <factor>` (client_golang's ns ÷ durationHistogram's,
// the rounds' median: above 1, tollgate's costs less). make bench-core
// runs it.
func BenchmarkObserveVsClientGolang(b *testing.B) {
	if b.N > 1 {
		return // measured once, at b.N == 1, by its own rounds
	}
	theirs := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "d", Help: "d", Buckets: bucketSeconds()}, []string{"policy"}).WithLabelValues("p")
	ours := newDurationVec("d", "d").forPolicy("p")
	// Decisions of 0.1-1.1 µs, as a memory store's are.
	contenders := []func(d time.Duration){func(d time.Duration) { theirs.Observe(d.Seconds()) }, ours.observe}
	ns := benchkeys.Interleaved(len(contenders), 30, 1_000_000, func(i, n int) {
		for j := range n {
			contenders[i](time.Duration(100 + j&1023))
		}
	})
	g := benchkeys.GapOf(ns[0], ns[1])
	fmt.Printf("client_golang %.1f ns, tollgate %.1f ns per observation (medians of 30 rounds)\n", benchkeys.Median(ns[0]), benchkeys.Median(ns[1]))
	fmt.Printf("vs client_golang histogram-observe %.2f (tollgate %.1f ns above it, rounds' quartiles %.1f to %.1f)\n", g.Factor, g.Median, g.Q1, g.Q3)
}
