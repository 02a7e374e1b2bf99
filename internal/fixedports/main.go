// Command fixedports keeps free the fixed TCP ports a later service must
// bind (make kong-spec: Kong's spec run starts Postgres on 55432 and
// Redis on 36379 and 36380).
//
// Those ports lie in Linux's ephemeral range (32768-60999), from which the
// kernel picks the local port of every outgoing connection. A connection
// closed from the client side keeps its port in TIME_WAIT for 60 s, and
// while it does, a server cannot bind that port even with SO_REUSEADDR:
// CI met this when Postgres failed with "could not bind IPv4 address
// 127.0.0.1: Address already in use" right after make kong-test, which
// opens thousands of connections.
//
// -reserve adds the ports to net.ipv4.ip_local_reserved_ports, so that no
// later connection takes them (it lasts until reboot, and needs root; a
// machine that refuses it is told so and the command goes on). -wait D
// then waits, at most D, until no socket but a listener holds any of
// them, saying once what it waits for.
//
// Usage: fixedports [-reserve] [-wait 150s] PORT...
package main

import (
	"bufio"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

const reservedPortsFile = "/proc/sys/net/ipv4/ip_local_reserved_ports"

// socketTables are the kernel's tables of TCP sockets, IPv4 and IPv6.
var socketTables = []string{"/proc/net/tcp", "/proc/net/tcp6"}

func main() {
	reserve := flag.Bool("reserve", false, "add the ports to "+reservedPortsFile)
	wait := flag.Duration("wait", 0, "wait at most this long until no socket but a listener holds a port; 0: do not wait")
	flag.Parse()
	ports, err := parsePorts(flag.Args())
	if err != nil || len(ports) == 0 {
		fmt.Fprintf(os.Stderr, "fixedports: %v\nusage: fixedports [-reserve] [-wait 150s] PORT...\n", err)
		os.Exit(2)
	}
	if *reserve {
		if added, err := reservePorts(reservedPortsFile, ports); err != nil {
			fmt.Printf("fixedports: could not reserve ports %s from the ephemeral range (%v); a connection may still take one\n", joinPorts(ports), err)
		} else if len(added) > 0 {
			fmt.Printf("fixedports: reserved ports %s from the ephemeral range (net.ipv4.ip_local_reserved_ports, until reboot)\n", joinPorts(added))
		}
	}
	if *wait > 0 {
		if err := waitFree(ports, *wait, os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "fixedports: %v\n", err)
			os.Exit(1)
		}
	}
}

func parsePorts(args []string) ([]int, error) {
	var ports []int
	for _, a := range args {
		p, err := strconv.Atoi(a)
		if err != nil || p < 1 || p > 65535 {
			return nil, fmt.Errorf("port %q: want a number from 1 to 65535", a)
		}
		ports = append(ports, p)
	}
	if len(ports) == 0 {
		return nil, errors.New("no port given")
	}
	return ports, nil
}

func joinPorts(ports []int) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

// reservePorts adds ports to the reserved list in file (the kernel's
// format: "1000-1002,55432"), keeping what it held, and returns the ports
// it added.
func reservePorts(file string, ports []int) ([]int, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	list := strings.TrimSpace(string(b))
	var added []int
	for _, p := range ports {
		in, err := inPortList(list, p)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", file, err)
		}
		if !in {
			added = append(added, p)
		}
	}
	if len(added) == 0 {
		return nil, nil
	}
	if list != "" {
		list += ","
	}
	if err := os.WriteFile(file, []byte(list+joinPorts(added)+"\n"), 0o644); err != nil {
		return nil, err
	}
	return added, nil
}

// inPortList reports whether list ("1000-1002,55432") holds port.
func inPortList(list string, port int) (bool, error) {
	if list == "" {
		return false, nil
	}
	for _, item := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(item), "-")
		from, err := strconv.Atoi(lo)
		if err != nil {
			return false, fmt.Errorf("unreadable item %q", item)
		}
		to := from
		if isRange {
			if to, err = strconv.Atoi(hi); err != nil {
				return false, fmt.Errorf("unreadable item %q", item)
			}
		}
		if from <= port && port <= to {
			return true, nil
		}
	}
	return false, nil
}

// socket is one row of a kernel socket table.
type socket struct {
	local, remote string // address:port
	port          int    // the local port
	state         string // as ss names it: LISTEN, TIME-WAIT, ...
}

// tcpStates names the kernel's TCP states (include/net/tcp_states.h).
var tcpStates = map[string]string{
	"01": "ESTAB", "02": "SYN-SENT", "03": "SYN-RECV", "04": "FIN-WAIT-1",
	"05": "FIN-WAIT-2", "06": "TIME-WAIT", "07": "CLOSE", "08": "CLOSE-WAIT",
	"09": "LAST-ACK", "0A": "LISTEN", "0B": "CLOSING",
}

// readSockets parses a /proc/net/tcp or /proc/net/tcp6 table.
func readSockets(r io.Reader) ([]socket, error) {
	var out []socket
	sc := bufio.NewScanner(r)
	first := true
	for sc.Scan() {
		if first { // the column names
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 4 {
			continue
		}
		local, port, err := decodeAddr(f[1])
		if err != nil {
			return nil, err
		}
		remote, rport, err := decodeAddr(f[2])
		if err != nil {
			return nil, err
		}
		state := tcpStates[f[3]]
		if state == "" {
			state = "state " + f[3]
		}
		out = append(out, socket{
			local:  net.JoinHostPort(local, strconv.Itoa(port)),
			remote: net.JoinHostPort(remote, strconv.Itoa(rport)),
			port:   port, state: state,
		})
	}
	return out, sc.Err()
}

// decodeAddr reads the kernel's "0100007F:D848": the address in hex as
// the host stores it (32-bit words in host order, little-endian here),
// then the port in hex.
func decodeAddr(s string) (string, int, error) {
	h, p, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(p, 16, 16)
	raw, herr := hex.DecodeString(h)
	if !ok || err != nil || herr != nil || (len(raw) != 4 && len(raw) != 16) {
		return "", 0, fmt.Errorf("unreadable socket address %q", s)
	}
	ip := make(net.IP, len(raw))
	for w := 0; w < len(raw); w += 4 {
		for i := 0; i < 4; i++ {
			ip[w+i] = raw[w+3-i]
		}
	}
	return ip.String(), int(port), nil
}

// holders returns, per port, the sockets that keep a server from binding
// it: none when a listener has it (the service is up, or someone else's
// is, which the service will say when it starts), else every socket whose
// local port it is.
func holders(ports []int) (map[int][]socket, error) {
	want := map[int]bool{}
	for _, p := range ports {
		want[p] = true
	}
	held := map[int][]socket{}
	listening := map[int]bool{}
	for _, table := range socketTables {
		f, err := os.Open(table)
		if errors.Is(err, os.ErrNotExist) { // no IPv6
			continue
		}
		if err != nil {
			return nil, err
		}
		socks, err := readSockets(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %v", table, err)
		}
		for _, s := range socks {
			if !want[s.port] {
				continue
			}
			if s.state == "LISTEN" {
				listening[s.port] = true
			}
			held[s.port] = append(held[s.port], s)
		}
	}
	for p := range listening {
		delete(held, p)
	}
	return held, nil
}

// describe says, in one line, what holds the ports.
func describe(held map[int][]socket) string {
	var ports []int
	for p := range held {
		ports = append(ports, p)
	}
	sort.Ints(ports)
	var parts []string
	for _, p := range ports {
		s := held[p]
		parts = append(parts, fmt.Sprintf("port %d: %d socket(s), e.g. %s %s -> %s", p, len(s), s[0].state, s[0].local, s[0].remote))
	}
	return strings.Join(parts, "; ")
}

// waitFree polls until no socket but a listener holds any of ports, at
// most limit, saying on w once what it waits for and how long it took.
func waitFree(ports []int, limit time.Duration, w io.Writer) error {
	start := time.Now()
	said := false
	for {
		held, err := holders(ports)
		if err != nil {
			return err
		}
		if len(held) == 0 {
			if said {
				fmt.Fprintf(w, "fixedports: ports %s free after %.1f s\n", joinPorts(ports), time.Since(start).Seconds())
			}
			return nil
		}
		if time.Since(start) > limit {
			return fmt.Errorf("still held after %v, so a server cannot bind them: %s", limit, describe(held))
		}
		if !said {
			fmt.Fprintf(w, "fixedports: waiting (at most %v) for connections to leave ports a server will bind: %s\n", limit, describe(held))
			said = true
		}
		time.Sleep(250 * time.Millisecond)
	}
}
