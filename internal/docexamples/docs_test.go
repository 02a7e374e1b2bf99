// Package docexamples runs the shell examples of README.md and docs/ as a
// user would, against what `make run` serves: bin/caddy with
// Caddyfile.example (on free ports; the commands' localhost:8080 and
// localhost:2019 are rewritten to them). Every command found in a page
// is either run here, or named below with the test or target that runs
// it instead, so a new example cannot go unchecked.
package docexamples

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/caddyproc"
)

// elsewhere are the commands that need more than make run's Caddy, by
// their start, with what runs them.
var elsewhere = []struct{ prefix, why string }{
	{"make ", "CI runs make test and make docker-test; make run is what this test starts"},
	{"docker ", "make docker-test runs the compose files as written"},
	{"CGO_ENABLED=0 GOOS=linux go build", "make docker-test builds the plugin server so"},
	{"go tool xcaddy build", "make docker-test runs README's line as written (with --output, CGO_ENABLED=0 for its image); make run builds bin/caddy the same way"},
	{"xcaddy build", "the module proxy's tollgate, for a published release (none is on the proxy this test can reach); the checkout form is run by make docker-test"},
	{"CGO_ENABLED=0 go build -o /usr/local/bin/ ./kongplugin/cmd/...", "make docker-test runs README's line as written (into a directory of its own), checks each binary's version and bakes tollgate into the Kong image; make kong-test builds the servers the same way with -race and registers them in a real Kong"},
	{"tollgate keys", "the Kong plugin server's command: TestKongKeysCommand runs it, and make kong-test's TestKongKeysAgainstRunningKong against a running Kong"},
	{"curl -s localhost:8001", "Kong's Admin API: make kong-test's TestKongKeysAgainstRunningKong reads a plugin so from a running Kong"},
	{"for i in $(seq 12); do curl -s localhost:8081", "the Docker fleet: make docker-test"},
}

// outcomes check what a page says a command shows, given its output and
// how long it ran.
var outcomes = map[string]func(out string, took time.Duration) error{
	// README and docs/testing.md: five 200s, then 429.
	"for i in $(seq 7); do curl -si localhost:8080/ | head -1; done": statusLines("200 200 200 200 200 429 429"),
	"for i in $(seq 7); do curl -si localhost:8080 | head -1; done":  statusLines("200 200 200 200 200 429 429"),
	// ten 200, then 429 429: a burst of 10, and a token back every 0.5 s
	// (120/1m), which a slow run of the twelve requests may see.
	"for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code} ' -H 'X-API-Key: k1' localhost:8080/api/orders; done": func(out string, took time.Duration) error {
		codes := strings.Fields(out)
		ok := len(codes) == 12 && strings.Join(codes[:10], " ") == strings.TrimSpace(strings.Repeat("200 ", 10))
		// The last two are 429, or 200 for a token that came back: at most
		// one per 0.5 s the run took.
		refilled, passed := int(took/(500*time.Millisecond)), 0
		for _, c := range codes[min(10, len(codes)):] {
			passed += strings.Count(c, "200")
			ok = ok && (c == "200" || c == "429")
		}
		if !ok || passed > refilled {
			return fmt.Errorf("got %q in %s, want ten 200, then 429 (a 200 more per 0.5 s taken)", out, took.Round(time.Millisecond))
		}
		return nil
	},
	// all four answered, 0.5 s apart.
	"for i in 1 2 3 4; do curl -s -o /dev/null -w '%{time_total}\\n' localhost:8080/slow & done; wait": func(out string, _ time.Duration) error {
		if n := len(strings.Fields(out)); n != 4 {
			return fmt.Errorf("%d answers, want 4: %q", n, out)
		}
		return nil
	},
	// RateLimit: "watch";r=0 on answers that are all 200.
	"for i in 1 2 3; do curl -si localhost:8080/report | grep -i ^ratelimit:; done": func(out string, _ time.Duration) error {
		if !strings.Contains(out, `"watch";r=0`) {
			return fmt.Errorf("no RateLimit \"watch\";r=0 in %q", out)
		}
		return nil
	},
	// the rate-limit headers.
	"curl -si localhost:8080/":              contains("Ratelimit-Policy:", "X-Ratelimit-Limit:"),
	"curl -si localhost:8080":               contains("Ratelimit-Policy:", "X-Ratelimit-Limit:"),
	"curl localhost:2019/tollgate/policies": contains(`"name":"per-client"`),
}

func statusLines(want string) func(string, time.Duration) error {
	return func(out string, _ time.Duration) error {
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(line); len(f) >= 2 {
				got = append(got, f[1])
			}
		}
		if strings.Join(got, " ") != want {
			return fmt.Errorf("statuses %v, want %s", got, want)
		}
		return nil
	}
}

func contains(parts ...string) func(string, time.Duration) error {
	return func(out string, _ time.Duration) error {
		for _, p := range parts {
			if !strings.Contains(out, p) {
				return fmt.Errorf("%q lacks %q", out, p)
			}
		}
		return nil
	}
}

// example is one command of a page, with where it was written.
type example struct {
	command, where string
}

var (
	fence     = regexp.MustCompile("^\\s*```")
	inlineRun = regexp.MustCompile("`((?:for |curl )[^`]*)`")
	comment   = regexp.MustCompile(`\s+#\s.*$`)
	command   = regexp.MustCompile(`^(curl|for|make|docker|go|xcaddy|tollgate keys|CGO_ENABLED=\S+)\s`)
)

// examples finds the commands of README.md and docs/*.md: lines of code
// blocks that start with a command, and inline code that runs curl.
func examples(t *testing.T) []example {
	pages, _ := filepath.Glob("../../docs/*.md")
	pages = append([]string{"../../README.md"}, pages...)
	var out []example
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		inBlock := false
		for i, line := range strings.Split(string(b), "\n") {
			where := fmt.Sprintf("%s:%d", strings.TrimPrefix(page, "../../"), i+1)
			if fence.MatchString(line) {
				inBlock = !inBlock
				continue
			}
			if inBlock {
				if c := strings.TrimSpace(comment.ReplaceAllString(line, "")); command.MatchString(c + " ") {
					out = append(out, example{c, where})
				}
				continue
			}
			for _, m := range inlineRun.FindAllStringSubmatch(line, -1) {
				out = append(out, example{strings.ReplaceAll(m[1], `\|`, "|"), where})
			}
		}
	}
	return out
}

// exampleSite is Caddyfile.example's site block, and its global servers
// option, for caddyproc (which chooses the ports).
func exampleSite(t *testing.T) (global, body string) {
	b, err := os.ReadFile("../../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, ":8080 {")
	j := strings.LastIndex(s, "}")
	if i < 0 || j < i {
		t.Fatal("Caddyfile.example: no :8080 site")
	}
	// The servers option: its lines up to the one that closes it (a
	// comment inside may hold braces).
	var servers []string
	for _, line := range strings.Split(s[:i], "\n") {
		if strings.TrimSpace(line) == "servers {" || len(servers) > 0 {
			servers = append(servers, line)
			if strings.TrimSpace(line) == "}" {
				break
			}
		}
	}
	if len(servers) == 0 {
		t.Fatal("Caddyfile.example: no servers option")
	}
	return strings.Join(servers, "\n"), s[i+len(":8080 {") : j]
}

// TestDocsExamples runs every command of the pages that needs only make
// run's Caddy, each on a fresh one (the pages' counts start from an unused
// limit), and checks what the page says it shows.
func TestDocsExamples(t *testing.T) {
	global, body := exampleSite(t)
	ran, checked := 0, 0
	for _, ex := range examples(t) {
		if i := indexElsewhere(ex.command); i >= 0 {
			t.Logf("%s: not run here (%s): %s", ex.where, elsewhere[i].why, ex.command)
			continue
		}
		if !strings.Contains(ex.command, "localhost:8080") && !strings.Contains(ex.command, "localhost:2019") {
			t.Errorf("%s: %q needs neither make run's Caddy nor anything this test knows of: run it here or name what runs it", ex.where, ex.command)
			continue
		}
		caddy := caddyproc.StartGlobal(t, global, body)
		cmd := strings.NewReplacer("localhost:8080", strings.TrimPrefix(caddy.URL, "http://"),
			"localhost:2019", strings.TrimPrefix(caddy.AdminURL, "http://")).Replace(ex.command)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		sh := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", cmd)
		var stdout, stderr bytes.Buffer
		sh.Stdout, sh.Stderr = &stdout, &stderr
		began := time.Now()
		err := sh.Run()
		took := time.Since(began)
		cancel()
		ran++
		if err != nil && !strings.Contains(ex.command, "| head") { // head closes the pipe early
			t.Errorf("%s: %s: %v\n%s%s", ex.where, ex.command, err, stdout.String(), stderr.String())
			continue
		}
		out := stdout.String()
		if check, ok := outcomes[ex.command]; ok {
			checked++
			if err := check(out, took); err != nil {
				t.Errorf("%s: %s: %v", ex.where, ex.command, err)
			}
		} else if strings.Contains(out, `"error"`) {
			// The operators' API answers a refused call with {"error": ...}.
			t.Errorf("%s: %s: the API refused it: %s", ex.where, ex.command, out)
		}
	}
	t.Logf("%d commands run against make run's Caddy, %d of them checked against what their page says", ran, checked)
	if ran == 0 {
		t.Fatal("no command found to run")
	}
}

func indexElsewhere(c string) int {
	for i, e := range elsewhere {
		if strings.HasPrefix(c, e.prefix) {
			return i
		}
	}
	return -1
}
