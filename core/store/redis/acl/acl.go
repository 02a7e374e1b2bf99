// Package acl is the least privilege a Redis user needs to serve as
// tollgate's store: the commands it sends and those its Lua scripts call,
// on its key prefix alone.
package acl

import "strings"

// Commands are the Redis ACL command rules of tollgate's user:
//   - its decisions: FCALL, and FUNCTION LOAD when Redis lacks the
//     library (without them the store sends the same code as a script);
//   - its scripts: EVALSHA, and EVAL and SCRIPT LOAD when Redis has not
//     cached them, and what they call (TIME, hashes and sorted sets, PEXPIRE,
//     PTTL);
//   - PING, the breaker's probe;
//   - an operator's reset: DEL, or HDEL and DEL in MULTI/EXEC;
//   - eventual mode's per-window counts: INCRBY, PEXPIRE, DEL;
//   - in a Cluster, the slot map the client reads.
const Commands = "-@all +fcall +function|load +evalsha +eval +script|load +ping +del +hdel +multi +exec +incrby +pexpire +pttl " +
	"+time +hmget +hset +hincrby +zadd +zcount +zrange +zrangebyscore +zrem +zremrangebyscore +zremrangebyrank " +
	"+cluster|slots +cluster|shards"

// Rule is the ACL rule (as `ACL SETUSER <user> <rule>` or a users file's
// `user <user> <rule>` take it) of a user with password that can run
// Commands on the keys under prefix ("tollgate:" by default) and nothing
// else: no other key, no channel.
func Rule(password, prefix string) string {
	return strings.Join([]string{"on", ">" + password, "resetkeys", "~" + prefix + "*", "resetchannels", Commands}, " ")
}
