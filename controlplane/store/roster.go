package store

// AgentInfo is what the fleet's roster holds of one connected agent, so
// that any replica can list every agent (clodexctl agents), not only the
// ones whose streams it holds.
type AgentInfo struct {
	ID                string   `json:"id"`
	Host              string   `json:"host"`
	Version           string   `json:"version"`
	CapabilityVersion int      `json:"capability_version"`
	Accounts          []string `json:"accounts"`
	// Replica is the control-plane replica holding the agent's stream.
	Replica         string `json:"replica,omitempty"`
	ConnectedUnixMs int64  `json:"connected_unix_ms"`
	LastSeenUnixMs  int64  `json:"last_seen_unix_ms"`
	// UntilUnixMs is when the agent stops counting as live without a
	// newer heartbeat.
	UntilUnixMs int64 `json:"until_unix_ms"`
}
