// Package callgrind counts the instructions a program executes, under
// valgrind's callgrind: the same for the same binary and inputs whatever
// else the machine does, so the benchmarks' comparisons in instructions
// hold on every CPU.
package callgrind

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// collected is callgrind's summary line of instructions executed.
var collected = regexp.MustCompile(`Collected : (\d+)`)

// Instructions runs program with args under callgrind, on one thread,
// with env added to its environment, and returns the instructions it
// executed.
func Instructions(env []string, program string, args ...string) (int64, error) {
	dir, err := os.MkdirTemp("", "callgrind-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	cmd := exec.Command("valgrind", append([]string{"--tool=callgrind", "--callgrind-out-file=" + dir + "/cg.out", program}, args...)...)
	// One thread, and no asynchronous preemption: its signals can abort
	// callgrind (an assertion in its signal handling), and a serial run
	// needs none.
	cmd.Env = append(append(os.Environ(), "GOMAXPROCS=1", "GODEBUG=asyncpreemptoff=1"), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("%s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	for _, line := range strings.Split(stderr.String(), "\n") {
		if m := collected.FindStringSubmatch(line); m != nil {
			return strconv.ParseInt(m[1], 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no instruction count in callgrind's output:\n%s", strings.Join(args, " "), stderr.String())
}
