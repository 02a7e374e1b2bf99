package kongdb

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/tollgate/tollgate/core/tlstrust"
)

// Conn is how to reach Kong's database: Kong's pg_* settings.
type Conn struct {
	Host     string `json:"host"`
	Port     int    `json:"port"`
	User     string `json:"user"`
	Password string `json:"password,omitempty"`
	Database string `json:"database"`
	// Schema is Kong's pg_schema: the schema Kong's tables are in ("" for
	// the server's search_path).
	Schema string `json:"schema,omitempty"`
	// SSL and SSLVerify are Kong's pg_ssl and pg_ssl_verify; CAFile holds
	// the CAs that verify the server (Kong's lua_ssl_trusted_certificate)
	// and MaxChain bounds its chain ("" and 0: the system's, no bound).
	SSL       bool   `json:"ssl,omitempty"`
	SSLVerify bool   `json:"ssl_verify,omitempty"`
	CAFile    string `json:"ca_file,omitempty"`
	MaxChain  int    `json:"max_chain,omitempty"`
	// Timeout bounds connecting and each decision's statements; 0 means 5 s.
	Timeout time.Duration `json:"timeout,omitempty"`
	// MaxConns is the pool's size; 0 means pgx's default (4, or one per CPU).
	MaxConns int32 `json:"max_conns,omitempty"`
}

// sharedPool is one pool of connections, shared by every Store of a Conn.
type sharedPool struct {
	pool *pgxpool.Pool
	key  string
	refs int
}

var (
	poolsMu sync.Mutex
	pools   = map[string]*sharedPool{}
)

// acquirePool returns c's pool, opening it for its first Store.
func acquirePool(c Conn) (*sharedPool, error) {
	b, _ := json.Marshal(c)
	key := string(b)
	poolsMu.Lock()
	defer poolsMu.Unlock()
	if p := pools[key]; p != nil {
		p.refs++
		return p, nil
	}
	cfg, err := c.config()
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("kong database: %w", err)
	}
	p := &sharedPool{pool: pool, key: key, refs: 1}
	pools[key] = p
	return p, nil
}

// release gives a Store's share back, closing the pool with the last.
func (p *sharedPool) release() {
	poolsMu.Lock()
	p.refs--
	last := p.refs == 0
	if last {
		delete(pools, p.key)
	}
	poolsMu.Unlock()
	if last {
		p.pool.Close()
	}
}

// config is c as pgx's pool config. The connection is made lazily, by the
// first decision: a database down when Kong starts an instance is a
// failure of its requests (fault_tolerant), not of its config.
func (c Conn) config() (*pgxpool.Config, error) {
	if c.Host == "" || c.Database == "" || c.User == "" {
		return nil, fmt.Errorf("kong database: host %q, database %q and user %q must all be set", c.Host, c.Database, c.User)
	}
	if c.Port < 1 || c.Port > 65535 {
		return nil, fmt.Errorf("kong database: port %d must be between 1 and 65535", c.Port)
	}
	cfg, err := pgxpool.ParseConfig("")
	if err != nil {
		return nil, err
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	cc := cfg.ConnConfig
	cc.Host, cc.Port, cc.User, cc.Password, cc.Database = c.Host, uint16(c.Port), c.User, c.Password, c.Database
	cc.ConnectTimeout = timeout
	cc.Fallbacks = nil
	cc.RuntimeParams = map[string]string{"application_name": "tollgate"}
	if c.Schema != "" {
		cc.RuntimeParams["search_path"] = c.Schema
	}
	cc.TLSConfig = nil
	if c.SSL {
		t := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.Host, InsecureSkipVerify: !c.SSLVerify}
		if c.SSLVerify {
			if c.CAFile != "" {
				roots, err := tlstrust.CAFile(c.CAFile)
				if err != nil {
					return nil, fmt.Errorf("kong database: pg_ssl_verify: %w", err)
				}
				t.RootCAs = roots
			}
			if most := c.MaxChain; most > 0 {
				t.VerifyConnection = tlstrust.MaxChain(most, "lua_ssl_verify_depth")
			}
		}
		cc.TLSConfig = t
	}
	cc.DialFunc = (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext
	if c.MaxConns > 0 {
		cfg.MaxConns = c.MaxConns
	}
	cfg.MinConns = 0
	cfg.HealthCheckPeriod = time.Minute
	return cfg, nil
}

// Addr is the database's address, for messages.
func (c Conn) Addr() string { return net.JoinHostPort(c.Host, strconv.Itoa(c.Port)) }
