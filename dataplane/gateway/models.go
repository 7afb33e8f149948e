package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/clodex/clodex/dataplane/translate"
)

func (s *Server) serveCountTokens(w *record, r *http.Request) {
	body, herr := s.readBody(w, r)
	if herr != nil {
		w.err = herr
		writeError(w, herr.status, herr.typ, herr.message)
		return
	}
	// The same checks as /v1/messages: what could not be sent is refused,
	// and what is counted is what would be forwarded.
	req, err := translate.DecodeCountTokens(body)
	if err == nil {
		w.model = req.Model()
		err = s.cfg.Models.Check(req.Model())
	}
	if err == nil {
		_, err = translate.ToResponses(req, translate.Options{Models: s.cfg.Models})
	}
	if err != nil {
		w.err = err
		writeError(w, http.StatusBadRequest, "invalid_request_error", requestErrorMessage(err))
		return
	}
	w.Header().Set("X-Relay-Token-Count-Source", "local-estimate")
	writeJSON(w, http.StatusOK, []byte(`{"input_tokens":`+strconv.Itoa(req.EstimatedTokens())+`}`))
}

// modelEntry is one model of GET /v1/models: Anthropic's model object
// (docs/translation.md §2.2) and upstream_model, the Codex model the id is
// sent as.
type modelEntry struct {
	Type           string `json:"type"`
	ID             string `json:"id"`
	DisplayName    string `json:"display_name"`
	CreatedAt      string `json:"created_at"`
	ContextWindow  int    `json:"context_window"`
	MaxInputTokens int    `json:"max_input_tokens"`
	UpstreamModel  string `json:"upstream_model"`
}

func modelEntryOf(m translate.ModelInfo) modelEntry {
	e := modelEntry{Type: "model", ID: m.ID, DisplayName: m.DisplayName, CreatedAt: "2025-01-01T00:00:00Z",
		ContextWindow: m.ContextWindow, MaxInputTokens: m.ContextWindow, UpstreamModel: m.Upstream}
	if e.DisplayName == "" {
		e.DisplayName = m.ID
	}
	return e
}

// renderModels builds the GET /v1/models body (docs/translation.md §2.2) and one body per
// model id.
func renderModels(list []translate.ModelInfo) ([]byte, map[string][]byte) {
	entries := make([]modelEntry, 0, len(list))
	byID := make(map[string][]byte, len(list))
	for _, m := range list {
		e := modelEntryOf(m)
		entries = append(entries, e)
		b, _ := json.Marshal(e)
		byID[m.ID] = b
	}
	page := struct {
		Data    []modelEntry `json:"data"`
		HasMore bool         `json:"has_more"`
		FirstID *string      `json:"first_id"`
		LastID  *string      `json:"last_id"`
	}{Data: entries}
	if len(entries) > 0 {
		page.FirstID, page.LastID = &entries[0].ID, &entries[len(entries)-1].ID
	}
	b, _ := json.Marshal(page)
	return b, byID
}

// serveModels answers GET /v1/models.
func (s *Server) serveModels(w *record, _ *http.Request) { writeJSON(w, http.StatusOK, s.models) }

// serveModel answers GET /v1/models/{id}: any accepted name.
func (s *Server) serveModel(w *record, r *http.Request) {
	id := r.PathValue("id")
	if body, ok := s.modelIDs[id]; ok {
		writeJSON(w, http.StatusOK, body)
		return
	}
	if info, ok := s.cfg.Models.Info(id); ok { // accepted, though not listed
		b, _ := json.Marshal(modelEntryOf(info))
		writeJSON(w, http.StatusOK, b)
		return
	}
	writeError(w, http.StatusNotFound, "not_found_error", fmt.Sprintf("Model '%s' not found; GET /v1/models lists the accepted models", id))
}
