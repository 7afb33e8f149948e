package docs_test

import (
	"bytes"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// secretPatterns match credentials that must never be committed: API keys
// of the sk- form (OpenAI, Anthropic), JSON Web Tokens (ChatGPT access and
// id tokens are JWTs), PEM private keys, GitHub tokens and AWS access key
// ids. key is a string every match contains, a cheap filter before the
// expression runs.
var secretPatterns = []struct {
	kind string
	key  string
	re   *regexp.Regexp
}{
	{"an sk- API key", "sk-", regexp.MustCompile(`\bsk-[A-Za-z0-9_-]{20,}`)},
	{"a JSON Web Token", "eyJ", regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{15,}\.eyJ[A-Za-z0-9_-]{15,}\.`)},
	{"a private key", "PRIVATE KEY", regexp.MustCompile(`-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----`)},
	{"a GitHub token", "_", regexp.MustCompile(`\bgh[pousr]_[A-Za-z0-9]{36,}`)},
	{"an AWS access key id", "AKIA", regexp.MustCompile(`\bAKIA[0-9A-Z]{16}\b`)},
}

// mayHoldTokens reports whether a file is test data that must look like
// real credentials to test what it tests: Go test files, testdata folders
// and the sanitised client captures under internal/captures (the data, not
// the package's Go source), whose tokens were replaced by fakes of the real
// shape.
func mayHoldTokens(p string) bool {
	return strings.HasSuffix(p, "_test.go") ||
		strings.HasPrefix(p, "testdata/") || strings.Contains(p, "/testdata/") ||
		strings.HasPrefix(p, "internal/captures/") && path.Ext(p) != ".go"
}

// scanSecrets returns one line per token-like string in files (repository
// path → content) outside the test data mayHoldTokens allows. A line names
// the file, the line and the kind of credential and shows only the match's
// first characters, so the report does not repeat a secret. An sk- key
// without a digit ("sk-your-key-goes-here") is a placeholder, not a key.
func scanSecrets(files map[string][]byte) []string {
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	var problems []string
	for _, p := range paths {
		data := files[p]
		if mayHoldTokens(p) || bytes.IndexByte(data, 0) >= 0 {
			continue
		}
		for _, sp := range secretPatterns {
			if !bytes.Contains(data, []byte(sp.key)) {
				continue
			}
			for _, loc := range sp.re.FindAllIndex(data, -1) {
				m := data[loc[0]:loc[1]]
				if strings.HasPrefix(string(m), "sk-") && !bytes.ContainsAny(m, "0123456789") {
					continue
				}
				line := 1 + bytes.Count(data[:loc[0]], []byte("\n"))
				problems = append(problems, fmt.Sprintf("%s:%d: looks like %s (%s…, %d characters); remove it and revoke it, or keep test data in a _test.go file or a testdata folder",
					p, line, sp.kind, m[:min(len(m), 6)], len(m)))
			}
		}
	}
	return problems
}

// TestNoCommittedSecrets fails when a file of the repository outside test
// data holds something that looks like a real credential.
func TestNoCommittedSecrets(t *testing.T) {
	files := repoFiles(t, "..")
	if _, ok := files["docs/README.md"]; !ok {
		t.Fatalf("docs/README.md is missing from the %d files found; run the test from the docs directory of a clodex checkout", len(files))
	}
	for _, p := range scanSecrets(files) {
		t.Error(p)
	}
}

func TestScanSecretsFindsPlanted(t *testing.T) {
	// The planted credentials are assembled from parts so that no line of
	// this file looks like one.
	var (
		apiKey  = "sk-" + "ant-api03-" + "Zq7Lm2Xv9Rt4Kp1Wn8Ys3Hd6Jf0Bc5Ga"
		openAI  = "sk-" + "proj-" + "N4rT8vW2xY6zA1bC3dE5fG7hJ9kL0mP2"
		jwt     = "eyJ" + "hbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9" + ".eyJ" + "zdWIiOiJhdXRoMHw2NzYxIiwiZXhwIjoxNzY1NDMyMTB9" + "." + "c2lnbmF0dXJlLW9mLXRoZS10b2tlbg"
		pemKey  = "-----BEGIN " + "RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END " + "RSA PRIVATE KEY-----"
		github  = "gh" + "p_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
		awsKey  = "AKIA" + "Q3EGRU7NOW2XYZ45"
		example = "CLODEX_AGENT_TOKEN=$(cat /run/secrets/agent)"
	)
	tests := []struct {
		name string
		path string
		data string
		want []string
	}{
		{"api key in a Go file", "cmd/x/main.go", "package main\n\nconst key = \"" + apiKey + "\"\n",
			[]string{"cmd/x/main.go:3: looks like an sk- API key (sk-ant…, 45 characters); remove it and revoke it, or keep test data in a _test.go file or a testdata folder"}},
		{"project key in a README", "README.md", "export OPENAI_API_KEY=" + openAI,
			[]string{"README.md:1: looks like an sk- API key (sk-pro…, 40 characters); remove it and revoke it, or keep test data in a _test.go file or a testdata folder"}},
		{"JWT in a manifest", "deploy/x.yaml", "a: 1\ntoken: " + jwt + "\n",
			[]string{"deploy/x.yaml:2: looks like a JSON Web Token (eyJhbG…, 86 characters); remove it and revoke it, or keep test data in a _test.go file or a testdata folder"}},
		{"private key", "deploy/tls/key.pem", pemKey,
			[]string{"deploy/tls/key.pem:1: looks like a private key (-----B…, 31 characters); remove it and revoke it, or keep test data in a _test.go file or a testdata folder"}},
		{"GitHub token in a script", "scripts/x.sh", "#!/bin/sh\nGH_TOKEN=" + github,
			[]string{"scripts/x.sh:2: looks like a GitHub token (ghp_a1…, 40 characters); remove it and revoke it, or keep test data in a _test.go file or a testdata folder"}},
		{"AWS key id", ".ci/run", "AWS_ACCESS_KEY_ID=" + awsKey,
			[]string{".ci/run:1: looks like an AWS access key id (AKIAQ3…, 20 characters); remove it and revoke it, or keep test data in a _test.go file or a testdata folder"}},
		{"token in a test file", "dataplane/x/x_test.go", "const tok = \"" + apiKey + "\"", nil},
		{"token in testdata", "dataplane/x/testdata/auth.json", `{"access_token":"` + jwt + `"}`, nil},
		{"token in a top-level testdata folder", "testdata/auth.json", `{"access_token":"` + jwt + `"}`, nil},
		{"token in a sanitised capture", "internal/captures/codex/x.json", `{"authorization":"Bearer ` + jwt + `"}`, nil},
		{"placeholder without a digit", "README.md", "ANTHROPIC_API_KEY=sk-" + "your-api-key-goes-here", nil},
		{"short fake key", "README.md", "ANTHROPIC_API_KEY=sk-" + "ant-users-own-key", nil},
		{"token variable name", "deploy/x.yaml", example, nil},
		{"unsigned empty JWT", "README.md", "e30.e30.", nil},
		{"binary file", "bin/x", "\x00" + apiKey, nil},
		{"the captures package's Go source", "internal/captures/captures.go", "// " + apiKey,
			[]string{"internal/captures/captures.go:1: looks like an sk- API key (sk-ant…, 45 characters); remove it and revoke it, or keep test data in a _test.go file or a testdata folder"}},
		{"a name that only starts like testdata", "internal/testdatabase/notes.md", apiKey,
			[]string{"internal/testdatabase/notes.md:1: looks like an sk- API key (sk-ant…, 45 characters); remove it and revoke it, or keep test data in a _test.go file or a testdata folder"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := scanSecrets(map[string][]byte{tt.path: []byte(tt.data)})
			if !slices.Equal(got, tt.want) {
				t.Errorf("scanSecrets() = %q, want %q", got, tt.want)
			}
			for _, secret := range []string{apiKey, openAI, jwt, github, awsKey} {
				if strings.Contains(strings.Join(got, "\n"), secret) {
					t.Errorf("the report repeats a planted secret: %q", got)
				}
			}
		})
	}
}
