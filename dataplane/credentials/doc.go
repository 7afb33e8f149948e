// Package credentials supplies the ChatGPT OAuth credential (a
// codexauth.Credential) that the data plane presents to the Codex backend.
// Consumers ask a [Source] for the current credential:
//
//	src, err := credentials.NewFileSource(credentials.FileConfig{Path: path})
//	cred, err := src.Credential(ctx)
//	cred, err = src.Rejected(ctx, cred.AccessToken) // after an upstream 401: one forced refresh
//
// [NewFileSource] returns a [RefreshingFile], the Source that keeps the
// token of a Codex auth.json (codexauth.ParseAuthFile) fresh. In
// [RefreshAuto] mode it refreshes under an exclusive lock on
// "<auth.json>.lock" shared with other processes: it re-reads the file and
// adopts a newer token another program wrote there, or else redeems the
// refresh token (codexauth.Redeem) and writes the rotated tokens back
// atomically with mode 0600. In [RefreshNever] mode it only re-reads the
// file. [LoadFile] reads an auth.json once. Errors name the file and what
// is wrong with it, never a token.
package credentials
