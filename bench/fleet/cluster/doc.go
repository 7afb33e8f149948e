// Package cluster runs a clodex fleet as real processes on loopback, for
// the fleet benchmark (bench/fleet) and the multi-process integration test
// (e2e/fleet): clodex-sim, an optional clodex-controlplane that can be
// killed and restarted on the same port, and several clodex-dataplane
// processes, plus a closed-loop load of Claude-Code-like agents. With
// replicas, the redis-server they share can be killed and restarted empty
// or with its AOF (Options.RedisAOF, Fleet.RedisRestart), and each replica
// can keep a --backup-dir (Options.Backups).
//
//	f, err := cluster.Start(ctx, cluster.Options{Bins: cluster.BinariesIn("bin"), Dir: dir, Mode: cluster.Central})
//	defer f.Close()
//	res, err := cluster.RunLoad(ctx, cluster.LoadConfig{BaseURLs: urls, Duration: time.Minute, Retry: cluster.Retry{MaxRetries: 10}})
//
// Every child runs in its own process group with an empty environment
// except HOME (a private directory), TMPDIR and PATH, logs to a file in
// Options.Dir, and is killed (the whole group) by Close; on Linux a child
// also dies with its parent. Credential files (auth.json, tokens) are
// written atomically with mode 0600.
package cluster
