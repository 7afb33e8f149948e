package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// mustPlainScript is a script without the bucket prelude.
func mustPlainScript(name string) *redis.Script {
	body, err := luaFS.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic(err)
	}
	return redis.NewScript(string(body))
}

var (
	scriptAgentsTouch = mustPlainScript("agents_touch")
	scriptAgentsDrop  = mustPlainScript("agents_drop")
	scriptAgentsCount = mustPlainScript("agents_count")
)

// agentsKey is the hash of the agents serving account key, on every
// replica: agent id -> "until_ms stream".
func (r *Redis) agentsKey(key string) string { return r.prefix + "g:" + key }

func (r *Redis) agentsKeys(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = r.agentsKey(k)
	}
	return out
}

// TouchAgent records in Redis that stream s serves keys and counts as live
// until until, for every replica to count; it replaces an older stream of
// the same agent. While Redis cannot be reached it fails (the next
// heartbeat touches again).
func (r *Redis) TouchAgent(ctx context.Context, s AgentStream, keys []string, until time.Time) error {
	if len(keys) == 0 {
		return nil
	}
	return r.call(ctx, "agents", func(ctx context.Context) error {
		return scriptAgentsTouch.Run(ctx, r.client, r.agentsKeys(keys), s.Agent, s.Stream,
			strconv.FormatInt(until.UnixMilli(), 10), strconv.FormatInt(r.now().UnixMilli(), 10)).Err()
	})
}

// DropAgent forgets stream s for keys in Redis (not a newer stream of its
// agent).
func (r *Redis) DropAgent(ctx context.Context, s AgentStream, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	return r.call(ctx, "agents", func(ctx context.Context) error {
		return scriptAgentsDrop.Run(ctx, r.client, r.agentsKeys(keys), s.Agent, s.Stream).Err()
	})
}

// LiveAgents counts, per key, the agents live at now on every replica
// sharing this Redis, in one script.
func (r *Redis) LiveAgents(ctx context.Context, keys []string, now time.Time) ([]int, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	var out []int
	err := r.call(ctx, "agents", func(ctx context.Context) error {
		v, err := scriptAgentsCount.Run(ctx, r.client, r.agentsKeys(keys), strconv.FormatInt(now.UnixMilli(), 10)).Int64Slice()
		if err != nil {
			return err
		}
		if len(v) != len(keys) {
			return fmt.Errorf("agents count: %d counts for %d keys", len(v), len(keys))
		}
		out = make([]int, len(v))
		for i, n := range v {
			out[i] = int(n)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("count live agents: %w", err)
	}
	return out, nil
}
