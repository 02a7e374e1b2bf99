package adaptive

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// judgedController returns a gradient controller at the default 500 ms
// interval that tests judge by hand.
func judgedController(t *testing.T) *Controller {
	t.Helper()
	a, err := NewJudged(Options{Controller: ControllerGradient})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// interval feeds one interval of n requests answered 200 after latency,
// and judges it.
func interval(a *Controller, n int, latency time.Duration) {
	for range n {
		a.Start()
		a.Observe(200, latency)
	}
	a.Judge()
}

// TestStallIsNotReadAsUpstreamLatency: a gateway that stalls for 300 ms
// (its process stopped, its machine busy) hears every answer it had in
// flight 300 ms late. Noted, the stall leaves its interval and the next
// unjudged and the factor where it was; a real rise of the upstream's
// latency, with no stall, still cuts at the first interval it fills; the
// same stall not noted cuts the factor to half, which is what the stall
// watch is for.
func TestStallIsNotReadAsUpstreamLatency(t *testing.T) {
	stalledRun := func(note bool) float64 {
		a := judgedController(t)
		for range 3 {
			interval(a, 100, 20*time.Millisecond) // unloaded: 20 ms
		}
		if f := a.Factor(); f != 1 {
			t.Fatalf("healthy intervals: factor %v, want 1", f)
		}
		// The stall: the interval's answers all heard 300 ms late; the next
		// interval's answers as they are.
		if note {
			a.NoteStall(300 * time.Millisecond)
		}
		interval(a, 100, 320*time.Millisecond)
		interval(a, 100, 20*time.Millisecond)
		return a.Factor()
	}
	if f := stalledRun(true); f < 1 {
		t.Fatalf("a noted 300 ms stall: factor %v, want it held at 1", f)
	}
	if f := stalledRun(false); f > 0.8 {
		t.Fatalf("the same stall not noted: factor %v, want a cut below 0.8 (the test would show nothing)", f)
	}

	a := judgedController(t)
	for range 3 {
		interval(a, 100, 20*time.Millisecond)
	}
	interval(a, 100, 320*time.Millisecond) // the upstream itself slows down
	if f := a.Factor(); f > 0.8 {
		t.Fatalf("a real rise of latency, no stall: factor %v after one interval, want a cut", f)
	}
	if a.Unjudged() != 0 {
		t.Fatalf("%d intervals unjudged with no stall", a.Unjudged())
	}
}

// TestStallsAllTheTimeStillAdapt: a gateway that notes a stall in every
// interval leaves at most two in a row unjudged, so an upstream that slows
// down for good is still cut by the third; a stall below the threshold
// (MinStall, or a tenth of the interval) leaves its interval judged.
func TestStallsAllTheTimeStillAdapt(t *testing.T) {
	a := judgedController(t)
	for range 3 {
		interval(a, 100, 20*time.Millisecond)
	}
	for i := 1; i <= 3; i++ {
		a.NoteStall(time.Second)
		interval(a, 100, 320*time.Millisecond)
		if f := a.Factor(); (i < 3) != (f == 1) {
			t.Fatalf("interval %d with a stall noted: factor %v, want 1 for two intervals and a cut at the third", i, f)
		}
	}
	if got := a.Unjudged(); got != 2 {
		t.Fatalf("%d intervals unjudged, want 2", got)
	}

	b := judgedController(t)
	for range 3 {
		interval(b, 100, 20*time.Millisecond)
	}
	b.NoteStall(49 * time.Millisecond) // under the 50 ms threshold
	interval(b, 100, 320*time.Millisecond)
	if f := b.Factor(); f == 1 || b.Unjudged() != 0 {
		t.Fatalf("a 49 ms stall: factor %v and %d intervals unjudged, want the interval judged (a cut)", f, b.Unjudged())
	}
}

// recordingSync is a FactorSync that keeps the signals it is sent and
// answers the factor it is given.
type recordingSync struct {
	sent   []Signals
	factor float64
}

func (r *recordingSync) SyncFactor(_ context.Context, sig Signals, _ bool, _ Options) (float64, error) {
	r.sent = append(r.sent, sig)
	return r.factor, nil
}

// TestStallInAFleetIsSentMarked: a controller that shares its factor sends
// a stalled interval's signals whole, marked Stalled, so the fleet's
// shared rule holds the interval without its sums being left empty when
// every node stalled at once (see NoteStall); an unstalled interval is
// sent unmarked.
func TestStallInAFleetIsSentMarked(t *testing.T) {
	a := judgedController(t)
	sync := &recordingSync{factor: 1}
	a.SetSync(sync)
	a.NoteStall(time.Second)
	interval(a, 100, 320*time.Millisecond)
	if len(sync.sent) != 1 || sync.sent[0].Answered != 100 || sync.sent[0].Latency == 0 || sync.sent[0].Stalled != 1 {
		t.Fatalf("a stalled interval in a fleet sent %+v, want its 100 answers and their latency, marked stalled", sync.sent)
	}
	if a.Unjudged() != 1 {
		t.Fatalf("%d intervals unjudged in a fleet, want 1 (this node's view of the shared rule)", a.Unjudged())
	}
	for range 3 {
		interval(a, 100, 20*time.Millisecond)
	}
	if len(sync.sent) != 4 || sync.sent[3].Stalled != 0 {
		t.Fatalf("sent %+v, want the intervals after it unmarked", sync.sent)
	}
}

// TestFleetHoldsAnIntervalAnyNodeStalledIn: two nodes' signals judged
// together by the shared rule: when one of them stalled (its latency read
// late, 320 ms against 20 ms), the fleet holds the factor for that
// interval and the next, then judges again; the same interval unmarked
// is cut.
func TestFleetHoldsAnIntervalAnyNodeStalledIn(t *testing.T) {
	o := gradientOptions(t)
	calm := Signals{Started: 50, Answered: 50, Latency: 20_000, Admitted: 50}
	late := Signals{Started: 50, Answered: 50, Latency: 320_000, Admitted: 50}
	// fleet judges one interval: both nodes' signals, then a read.
	fleet := func(s GradientState, sigs ...Signals) GradientState {
		now := s.Judged + o.Interval.Microseconds()
		for _, sig := range sigs {
			s = Gradient(s, now, sig, o)
		}
		return Gradient(s, now, Signals{}, o)
	}
	s := GradientState{Factor: 1, MinLatency: 20_000, Judged: 1}
	if cut := fleet(s, calm, late); cut.Factor >= 1 {
		t.Fatalf("a node's 320 ms interval unmarked: factor %v, want a cut", cut.Factor)
	}
	stalled := late
	stalled.Stalled = 1
	s = fleet(s, calm, stalled)
	if s.Factor != 1 || s.StallHeld != 1 || s.AfterStall != 1 {
		t.Fatalf("the stalled interval: %+v, want the factor held", s)
	}
	s = fleet(s, calm, late) // the stall's backlog, heard late
	if s.Factor != 1 || s.StallHeld != 2 || s.AfterStall != 0 {
		t.Fatalf("the interval after it: %+v, want the factor held", s)
	}
	if s = fleet(s, calm, calm); s.StallHeld != 0 || s.Factor != 1 {
		t.Fatalf("a calm interval after: %+v, want it judged (healthy)", s)
	}
	// Stalls all the time: every third interval is judged.
	for i := range 6 {
		s = fleet(s, calm, stalled)
		if held := i%3 != 2; (s.StallHeld > 0) != held {
			t.Fatalf("stalled interval %d in a row: held %d, want held %v", i+1, s.StallHeld, held)
		}
	}
}

// TestStallWatchSeesTheProcessStopped stops this test's own process with
// SIGSTOP for 300 ms (a child process sends SIGCONT) and waits for the
// process's stall watch to count the stall.
func TestStallWatchSeesTheProcessStopped(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("SIGSTOP of the test's own process: Linux only")
	}
	release := watchStalls()
	defer release()
	_, seen := stalledSince(0)
	pid := os.Getpid()
	cont := exec.Command("sh", "-c", "sleep 0.3; kill -CONT "+strconv.Itoa(pid))
	if err := cont.Start(); err != nil {
		t.Fatal(err)
	}
	// The child, a process of its own, runs on while this one is stopped.
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := cont.Wait(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		stalled, _ := stalledSince(seen)
		if stalled >= 250*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stall watch saw %v of a 300 ms stop, want at least 250 ms", stalled)
		}
		time.Sleep(stallTick)
	}
}

// TestAdmittedFollowsTheFactorChangeWithinAnInterval: a fleet's shared
// factor read halfway through an interval changes what the rest of its
// requests come through at; the interval's signals say so (Admitted).
func TestAdmittedFollowsTheFactorChangeWithinAnInterval(t *testing.T) {
	a := judgedController(t)
	sync := &recordingSync{factor: 1}
	a.SetSync(sync)
	for range 30 {
		a.Start()
	}
	sync.factor = 0.5
	a.ReadShared() // the fleet judged: 0.5 from now on
	for range 70 {
		a.Start()
	}
	a.Judge()
	if got := sync.sent[len(sync.sent)-1]; got.Started != 100 || got.Admitted != 30*1+70*0.5 {
		t.Fatalf("sent %+v, want 100 started, admitted 30 at 1 and 70 at 0.5 (65)", got)
	}
	// The next interval's requests all came through at 0.5.
	for range 10 {
		a.Start()
	}
	a.Judge()
	if got := sync.sent[len(sync.sent)-1]; got.Admitted != 10*0.5 {
		t.Fatalf("sent %+v, want admitted 5", got)
	}
}
