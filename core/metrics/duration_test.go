package metrics

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
)

// TestDurationVecExposesWhatClientGolangWould: the same durations observed
// by durationVec and by client_golang's HistogramVec with the same name,
// help and buckets gather to the same text, bucket edges included (a
// bound is inclusive, as le says), and each policy is its own series.
func TestDurationVecExposesWhatClientGolangWould(t *testing.T) {
	const name, help = "tollgate_store_duration_seconds", "Time the store took to decide one request, in seconds."
	bounds := make([]float64, len(durationBuckets))
	for i, b := range durationBuckets {
		bounds[i] = b.Seconds()
	}
	theirs := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: bounds}, []string{"policy"})
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

// BenchmarkObserveDuration is one decision's latency counted in its
// policy's histogram, against client_golang's HistogramVec child with the
// same buckets.
func BenchmarkObserveDuration(b *testing.B) {
	b.Run("tollgate", func(b *testing.B) {
		h := newDurationVec("d", "d").forPolicy("p")
		for i := 0; i < b.N; i++ {
			h.observe(time.Duration(2000 + i&1023))
		}
	})
	b.Run("client_golang", func(b *testing.B) {
		bounds := make([]float64, len(durationBuckets))
		for i, d := range durationBuckets {
			bounds[i] = d.Seconds()
		}
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "d", Help: "d", Buckets: bounds}, []string{"policy"}).WithLabelValues("p")
		for i := 0; i < b.N; i++ {
			h.Observe(time.Duration(2000 + i&1023).Seconds())
		}
	})
}
