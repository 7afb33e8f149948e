package redisstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/controlplane/store"
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
func (r *Store) agentsKey(key string) string { return r.prefix + "g:" + key }

func (r *Store) agentsKeys(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = r.agentsKey(k)
	}
	return out
}

// TouchAgent records in Redis that stream s serves keys and counts as live
// until until, for every replica to count; it replaces an older stream of
// the same agent. The entries lapse on their own, so a replica that dies
// leaves its agents counted only until their liveness ends. While Redis cannot be reached it fails (the next
// heartbeat touches again).
func (r *Store) TouchAgent(ctx context.Context, s store.AgentStream, keys []string, until time.Time) error {
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
func (r *Store) DropAgent(ctx context.Context, s store.AgentStream, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	return r.call(ctx, "agents", func(ctx context.Context) error {
		return scriptAgentsDrop.Run(ctx, r.client, r.agentsKeys(keys), s.Agent, s.Stream).Err()
	})
}

// LiveAgents counts, per key, the agents live at now on every replica
// sharing this Redis, in one script.
func (r *Store) LiveAgents(ctx context.Context, keys []string, now time.Time) ([]int, error) {
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

// RosterKeep is how long the roster keeps an agent after it stopped
// counting as live (listed as not live, as a replica lists its expired
// agents until it drops them); older entries are removed when listed.
const RosterKeep = time.Minute

// maxRoster bounds the entries one listing reads.
const maxRoster = 100_000

var scriptRosterRemove = mustPlainScript("roster_remove")

// rosterKey is the hash of the fleet's agents: agent id -> "stream\n" +
// AgentInfo as JSON.
func (r *Store) rosterKey() string { return r.prefix + "roster" }

// PutAgent records (or refreshes) an agent in the fleet's roster, stream
// s being the stream that carries it. The hash expires a while after the
// last write, so a fleet whose replicas all died leaves nothing behind.
func (r *Store) PutAgent(ctx context.Context, s store.AgentStream, info store.AgentInfo) error {
	b, err := json.Marshal(info)
	if err != nil {
		return fmt.Errorf("put agent %s: %w", info.ID, err)
	}
	return r.call(ctx, "roster", func(ctx context.Context) error {
		pipe := r.client.TxPipeline()
		pipe.HSet(ctx, r.rosterKey(), s.Agent, s.Stream+"\n"+string(b))
		pipe.PExpire(ctx, r.rosterKey(), 10*time.Minute)
		_, err := pipe.Exec(ctx)
		return err
	})
}

// RemoveAgent removes stream s's agent from the roster, unless a newer
// stream of the same agent (on any replica) has written it since.
func (r *Store) RemoveAgent(ctx context.Context, s store.AgentStream) error {
	return r.call(ctx, "roster", func(ctx context.Context) error {
		return scriptRosterRemove.Run(ctx, r.client, []string{r.rosterKey()}, s.Agent, s.Stream).Err()
	})
}

// Agents returns the fleet's roster at now: every agent live or stopped
// for less than RosterKeep, in no particular order. Older entries are
// removed.
func (r *Store) Agents(ctx context.Context, now time.Time) ([]store.AgentInfo, error) {
	var out []store.AgentInfo
	err := r.call(ctx, "roster", func(ctx context.Context) error {
		m, err := r.client.HGetAll(ctx, r.rosterKey()).Result()
		if err != nil {
			return err
		}
		var stale []string
		out = out[:0]
		for id, v := range m {
			if len(out) == maxRoster {
				break
			}
			_, js, ok := strings.Cut(v, "\n")
			var info store.AgentInfo
			if !ok || json.Unmarshal([]byte(js), &info) != nil || info.ID != id {
				stale = append(stale, id) // not one a replica wrote: drop it
				continue
			}
			if now.Sub(time.UnixMilli(info.UntilUnixMs)) > RosterKeep {
				stale = append(stale, id)
				continue
			}
			out = append(out, info)
		}
		// An entry refreshed between the read and this delete is lost
		// until its agent's next heartbeat (5 s) writes it again.
		if len(stale) > 0 {
			return r.client.HDel(ctx, r.rosterKey(), stale...).Err()
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list the fleet's agents: %w", err)
	}
	return out, nil
}
