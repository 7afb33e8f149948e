package simauth

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"strings"
	"time"
)

// deviceAuth is one pending device-code login.
type deviceAuth struct {
	id        string
	userCode  string
	clientID  string
	expiresAt time.Time
	approved  string // account id once approved
}

// authCode is an authorization code handed out by a completed device login,
// redeemable once with its PKCE verifier.
type authCode struct {
	verifier  string
	clientID  string
	accountID string
	expiresAt time.Time
}

// deviceStart is the answer to POST /api/accounts/deviceauth/usercode.
type deviceStart struct {
	DeviceAuthID string `json:"device_auth_id"`
	UserCode     string `json:"user_code"`
	Interval     string `json:"interval"`
	ExpiresIn    int64  `json:"expires_in"`
}

// deviceGrant is the answer to a successful device poll.
type deviceGrant struct {
	AuthorizationCode string `json:"authorization_code"`
	CodeChallenge     string `json:"code_challenge"`
	CodeVerifier      string `json:"code_verifier"`
}

// userCodeAlphabet avoids look-alike characters.
const userCodeAlphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"

func newUserCode() string {
	b := randomBytes(9)
	var sb strings.Builder
	for i, c := range b {
		if i == 4 {
			sb.WriteByte('-')
		}
		sb.WriteByte(userCodeAlphabet[int(c)%len(userCodeAlphabet)])
	}
	return sb.String()
}

// normalizeUserCode makes user-typed codes comparable.
func normalizeUserCode(s string) string { return strings.ToUpper(strings.TrimSpace(s)) }

// maxPendingDevices bounds the pending logins kept in memory.
const maxPendingDevices = 10000

// startDevice registers a new device-code login.
func (a *Authority) startDevice(clientID string) (deviceStart, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.clock()
	if len(a.devices) >= maxPendingDevices {
		a.pruneDevicesLocked(now)
	}
	if len(a.devices) >= maxPendingDevices {
		return deviceStart{}, fmt.Errorf("too many pending device logins (%d); complete some or wait for them to expire", maxPendingDevices)
	}
	d := &deviceAuth{
		id:        "deviceauth_" + randomHex(16),
		clientID:  clientID,
		expiresAt: now.Add(deviceCodeTTL),
	}
	for {
		d.userCode = newUserCode()
		if _, taken := a.userCodes[d.userCode]; !taken {
			break
		}
	}
	a.devices[d.id] = d
	a.userCodes[d.userCode] = d.id
	return deviceStart{
		DeviceAuthID: d.id,
		UserCode:     d.userCode,
		Interval:     "1",
		ExpiresIn:    int64(deviceCodeTTL / time.Second),
	}, nil
}

// pruneDevicesLocked forgets expired logins and codes. It is called only
// when a table is full, so its cost is amortized.
func (a *Authority) pruneDevicesLocked(now time.Time) {
	for id, d := range a.devices {
		if !now.Before(d.expiresAt) {
			delete(a.devices, id)
			delete(a.userCodes, d.userCode)
		}
	}
	for c, ac := range a.authCodes {
		if !now.Before(ac.expiresAt) {
			delete(a.authCodes, c)
		}
	}
}

// Poll outcomes other than success.
var (
	errDevicePending  = errors.New("device authorization pending")
	errDeviceUnknown  = errors.New("device authorization not found")
	errDeviceMismatch = errors.New("user_code does not belong to device_auth_id")
	errDeviceExpired  = errors.New("device authorization expired")
)

// pollDevice answers a poll. Unless ManualApproval is set, the first poll of
// a login approves it for DeviceAccountID (and still answers pending), so the
// second poll succeeds.
func (a *Authority) pollDevice(deviceAuthID, userCode string) (deviceGrant, string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.clock()
	d, ok := a.devices[deviceAuthID]
	if !ok {
		return deviceGrant{}, "", errDeviceUnknown
	}
	if normalizeUserCode(userCode) != d.userCode {
		return deviceGrant{}, "", errDeviceMismatch
	}
	if !now.Before(d.expiresAt) {
		delete(a.devices, d.id)
		delete(a.userCodes, d.userCode)
		return deviceGrant{}, "", errDeviceExpired
	}
	if d.approved == "" {
		if !a.manualApproval {
			d.approved = a.deviceAccountID
		}
		return deviceGrant{}, "", errDevicePending
	}
	delete(a.devices, d.id)
	delete(a.userCodes, d.userCode)
	verifier := b64.EncodeToString(randomBytes(32))
	challenge := sha256.Sum256([]byte(verifier))
	code := "ac_" + b64.EncodeToString(randomBytes(24))
	if len(a.authCodes) >= maxPendingDevices {
		a.pruneDevicesLocked(now)
	}
	a.authCodes[code] = &authCode{
		verifier:  verifier,
		clientID:  d.clientID,
		accountID: d.approved,
		expiresAt: now.Add(authCodeTTL),
	}
	return deviceGrant{
		AuthorizationCode: code,
		CodeChallenge:     b64.EncodeToString(challenge[:]),
		CodeVerifier:      verifier,
	}, d.approved, nil
}

// Approve approves the pending device-code login showing userCode for
// accountID, as a user signing in on the /codex/device page would. The next
// poll of that login then succeeds.
func (a *Authority) Approve(userCode, accountID string) error {
	if err := checkAccountID(accountID); err != nil {
		return fmt.Errorf("approve device login: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.clock()
	id, ok := a.userCodes[normalizeUserCode(userCode)]
	if !ok {
		return fmt.Errorf("approve device login: user code %q is not pending; start a login first", userCode)
	}
	d := a.devices[id]
	if !now.Before(d.expiresAt) {
		return fmt.Errorf("approve device login: user code %q: %w", userCode, errDeviceExpired)
	}
	d.approved = accountID
	return nil
}

// Grant failures of the authorization_code exchange.
var (
	errCodeUnknown     = errors.New("authorization code is unknown, expired or already used")
	errCodeVerifier    = errors.New("code_verifier does not match the authorization code")
	errCodeClientMatch = errors.New("client_id does not match the one that started the login")
)

// redeemCode exchanges an authorization code for a new token family.
func (a *Authority) redeemCode(code, verifier, clientID string) (Tokens, string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.clock()
	ac, ok := a.authCodes[code]
	if !ok || !now.Before(ac.expiresAt) {
		delete(a.authCodes, code)
		return Tokens{}, "", errCodeUnknown
	}
	if subtle.ConstantTimeCompare([]byte(verifier), []byte(ac.verifier)) != 1 {
		return Tokens{}, "", errCodeVerifier
	}
	if clientID != ac.clientID {
		return Tokens{}, "", errCodeClientMatch
	}
	delete(a.authCodes, code)
	fam := &family{id: "fam_" + randomHex(8), accountID: ac.accountID}
	t, err := a.issueLocked(fam, now)
	if err != nil {
		return Tokens{}, "", err
	}
	return t, fam.id, nil
}
