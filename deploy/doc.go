// Package deploy holds no code: it is the folder of deployment files, and
// its tests check them against the binaries they run.
//
//	../Dockerfile          the image (built by scripts/build.sh, as make build does)
//	systemd/               units for the control plane and a per-host data plane
//	compose/               Docker Compose: the whole system with tracing and dashboards
//	kubernetes/            a kustomize base and an overlay
//	grafana/               the dashboard over the binaries' Prometheus metrics
//	prometheus/            the scrape configuration compose uses
//
// The tests build the binaries once, the way the image does, and then
//
//   - check every flag named in a unit, a compose file or a manifest against
//     the flag set the binary prints for -h, so a renamed flag fails here;
//   - parse the Dockerfile: a static final stage with no shell and a
//     non-root user, built by the same command as make build; and build the
//     binaries twice to compare their digests;
//   - verify the units with systemd-analyze where it exists;
//   - decode every Kubernetes manifest strictly into the API types;
//   - query /metrics of running binaries for every metric the dashboard uses.
//
// See docs/operations.md for running clodex with these files.
package deploy
