// Package credentials supplies the ChatGPT OAuth credential that the data
// plane presents to the Codex backend.
//
// A [Credential] pairs an access token, held as a [Secret] that redacts
// itself in logs and formatted output, with the ChatGPT account id sent as
// the chatgpt-account-id header. Consumers ask a [Source] for the current
// credential once per turn:
//
//	src, err := credentials.LoadFile(path) // a Codex auth.json, read once
//	cred, err := src.Credential(ctx)
//
// [LoadFile] parses the Codex CLI's auth.json ([AuthFile]) and derives the
// account id from the access token's claims ([ParseClaims]); JWT signatures
// are never verified, the claims are only read. Errors name the file and
// what is wrong with it, never a token.
//
// [NewFileSource] returns a [RefreshingFile], the Source that keeps the
// token fresh. In [RefreshAuto] mode it refreshes under an exclusive lock on
// "<auth.json>.lock" shared with other processes: it re-reads the file and
// adopts a newer token another program wrote there, or else redeems the
// refresh token and writes the rotated tokens back atomically with mode
// 0600. In [RefreshNever] mode it only re-reads the file. Callers keep
// depending on [Source] only.
package credentials
