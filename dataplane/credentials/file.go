package credentials

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/clodex/clodex/internal/codexauth"
)

// FileSource is a [Source] backed by a Codex auth.json that is read once, by
// [LoadFile]. It never writes the file.
type FileSource struct {
	path string
	cred codexauth.Credential // immutable after LoadFile
}

// LoadFile reads and checks the Codex auth.json at path. Errors name the
// file and what is wrong with it.
func LoadFile(path string) (*FileSource, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("codex auth file %s does not exist; sign in with `codex login` or pass --codex-auth", path)
		}
		return nil, fmt.Errorf("read codex auth file: %w", err)
	}
	f, err := codexauth.ParseAuthFile(path, data)
	if err != nil {
		return nil, err
	}
	return &FileSource{path: path, cred: f.Credential()}, nil
}

// Path returns the file the source was loaded from.
func (s *FileSource) Path() string { return s.path }

// Credential implements Source. It returns the credential read by LoadFile.
func (s *FileSource) Credential(ctx context.Context) (codexauth.Credential, error) {
	if err := ctx.Err(); err != nil {
		return codexauth.Credential{}, err
	}
	return s.cred, nil
}
