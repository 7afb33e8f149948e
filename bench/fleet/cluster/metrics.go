package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Metric sums every sample of the named metric on the control plane's
// /metrics (the current process: counters restart at zero with it).
func (cp *ControlPlane) Metric(ctx context.Context, client *http.Client, name string) (float64, error) {
	if cp.AdminAddr == "" {
		return 0, errors.New("read control plane metric: the admin listener is off (Options.ControlPlaneAdmin)")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+cp.AdminAddr+"/metrics", nil)
	if err != nil {
		return 0, fmt.Errorf("read control plane metric: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("read control plane metric: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("read control plane metric: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("read control plane metric: GET /metrics: %s", resp.Status)
	}
	return SumMetric(body, name), nil
}

// SumMetric sums the samples of one metric in a Prometheus text
// exposition: lines "name value" and "name{labels} value".
func SumMetric(exposition []byte, name string) float64 {
	var sum float64
	for _, line := range bytes.Split(exposition, []byte("\n")) {
		s := string(line)
		if !strings.HasPrefix(s, name) {
			continue
		}
		rest := s[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue // a longer name with this prefix
		}
		if rest[0] == '{' {
			i := strings.LastIndexByte(rest, '}')
			if i < 0 {
				continue
			}
			rest = rest[i+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(fields[0], 64); err == nil {
			sum += v
		}
	}
	return sum
}
