package redis

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"

	goredis "github.com/redis/go-redis/v9"
)

// decider sends decide calls: FCALL of DecideFunction, loading
// DecideLibrary into a server that lacks it, or EVALSHA of DecideLua for
// good once a server refuses functions (Redis before 7, a user whose ACL
// lacks FCALL or FUNCTION LOAD, a server that cannot load the library).
// Either form decides alike; the function costs Redis less per call.
type decider struct {
	scripts atomic.Bool
}

// maxRecoveries bounds the loads and fallbacks one call goes through: a
// missing library, then a refused load (the script), then a missing script.
const maxRecoveries = 3

// doer sends a command: a client, or a pipeline that queues it.
type doer interface {
	Do(ctx context.Context, args ...any) *goredis.Cmd
}

// cmd queues (on a pipeline) or sends one decide call of keys and args
// on c.
func (d *decider) cmd(ctx context.Context, c doer, keys []string, args []any) *goredis.Cmd {
	command := make([]any, 3, 3+len(keys)+len(args))
	command[2] = len(keys)
	for _, k := range keys {
		command = append(command, k)
	}
	return d.send(ctx, c, append(command, args...))
}

// send queues or sends the decide call command, whose first two places
// it fills with the command's and the code's names: FCALL of the
// function, or EVALSHA of the script once Redis refused functions.
func (d *decider) send(ctx context.Context, c doer, command []any) *goredis.Cmd {
	if d.scripts.Load() {
		command[0], command[1] = "evalsha", decideScript.Hash()
	} else {
		command[0], command[1] = "fcall", DecideFunction
	}
	return c.Do(ctx, command...)
}

// runCommand sends the decide call command (see send) as run does.
func (d *decider) runCommand(ctx context.Context, c goredis.UniversalClient, command []any) *goredis.Cmd {
	return d.until(ctx, c, func() *goredis.Cmd { return d.send(ctx, c, command) })
}

// run sends one decide call on c, readying the server and sending it
// again while the server says it did not run it for want of the code.
func (d *decider) run(ctx context.Context, c goredis.UniversalClient, keys []string, args []any) *goredis.Cmd {
	return d.until(ctx, c, func() *goredis.Cmd { return d.cmd(ctx, c, keys, args) })
}

// until sends a decide call on c, readying the server and sending it again
// while the server says it did not run it for want of the code.
func (d *decider) until(ctx context.Context, c goredis.UniversalClient, send func() *goredis.Cmd) *goredis.Cmd {
	cmd := send()
	for range maxRecoveries {
		if !unrun(cmd.Err()) || !d.recover(ctx, c, cmd.Err()) {
			break
		}
		cmd = send()
	}
	return cmd
}

// unrun says whether err is a server's refusal of a decide call before
// running it: it lacks the script or the library, or takes no functions.
// Such a call may be sent again; any other failed call may have decided.
func unrun(err error) bool {
	return isNoScript(err) || isNoFunction(err) || refusesFunctions(err)
}

// recover readies c's servers for a call that err (unrun) says they did
// not run: loads what they lacked, or falls back to the script for good.
// It returns false when it could not (the call's error stands).
func (d *decider) recover(ctx context.Context, c goredis.UniversalClient, err error) bool {
	switch {
	case isNoScript(err):
		return decideScript.Load(ctx, c).Err() == nil
	case isNoFunction(err):
		loadErr := loadLibrary(ctx, c)
		var refused goredis.Error
		if loadErr != nil && errors.As(loadErr, &refused) {
			d.scripts.Store(true)
			return true
		}
		return loadErr == nil
	case refusesFunctions(err):
		d.scripts.Store(true)
		return true
	}
	return false
}

// Scripted says whether the store decides with EVALSHA of DecideLua,
// having found Redis refuse functions; false while it calls
// DecideFunction.
func (s *Store) Scripted() bool { return s.decider.scripts.Load() }

// loadLibrary loads DecideLibrary into c's server, or every primary of a
// Cluster. A server holding it already (another gateway loaded it) is
// ready too.
func loadLibrary(ctx context.Context, c goredis.UniversalClient) error {
	if cluster, ok := c.(*goredis.ClusterClient); ok {
		return cluster.ForEachMaster(ctx, func(ctx context.Context, node *goredis.Client) error {
			return loaded(node.FunctionLoad(ctx, DecideLibrary).Err())
		})
	}
	return loaded(c.FunctionLoad(ctx, DecideLibrary).Err())
}

// loaded is FUNCTION LOAD's err, nil when the server held the library
// already.
func loaded(err error) error {
	if err != nil && strings.Contains(err.Error(), "already exists") {
		return nil
	}
	return err
}

// isNoFunction says whether err is a server's refusal of an FCALL whose
// function it does not hold.
func isNoFunction(err error) bool {
	return err != nil && strings.Contains(strings.ToLower(err.Error()), "function not found")
}

// refusesFunctions says whether err is a refusal of FCALL itself: a
// command the server (Redis 6, here "unknown command 'FCALL'") or a proxy
// in front of it ("unsupported command") does not know, or the user may
// not run ("NOPERM ... 'fcall' command"). The decide code's own errors
// never name FCALL.
func refusesFunctions(err error) bool {
	if err == nil {
		return false
	}
	msg := strings.ToLower(err.Error())
	if !strings.Contains(msg, "fcall") {
		return false
	}
	for _, refusal := range []string{"unknown command", "unsupported", "not supported", "noperm", "not allowed"} {
		if strings.Contains(msg, refusal) {
			return true
		}
	}
	return false
}
