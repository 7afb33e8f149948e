package deploy

import "testing"

func composeCommandLines(t *testing.T) []commandLine    { return nil }
func kubernetesCommandLines(t *testing.T) []commandLine { return nil }
