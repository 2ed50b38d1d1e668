package doctor

// mcpheal's own credential on the probes, as mcpheal sends it.

import (
	"context"
	"io"
	"net/http"
	"slices"
)

// CredentialUse is what became of mcpheal's own credential in a run
// (Options.Credential). It holds no secret.
type CredentialUse struct {
	// From names the credential (Credential.String); LoginFile is the
	// token file of `mcpheal login` it reads, if it is one.
	From, LoginFile string
	// Err says why it could not be had (no login yet, a refresh refused);
	// the probes from then on went without it. "" when it could.
	Err string
	// Refused: the server answered 401 to it, and again to a new token
	// (or there was no new one to get).
	Refused bool
}

// do sends the request build makes (build is called again for a second
// send), with mcpheal's credential if the doctor has one. A 401 to the
// credential makes the doctor drop its token and send once more with a new
// one, as mcpheal does; a credential that cannot be had is recorded and
// the request goes without it.
func (d *prober) do(ctx context.Context, build func() (*http.Request, error)) (*http.Response, error) {
	req, err := build()
	if err != nil {
		return nil, err
	}
	sent := d.credHeader(ctx)
	if sent == nil {
		return d.c.Do(req)
	}
	setHeader(req, sent)
	resp, err := d.c.Do(req)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		return resp, err
	}
	d.cred.Refused(sent)
	again := d.credHeader(ctx)
	if again == nil || sameHeader(again, sent) {
		if again != nil {
			d.use.Refused = true // nothing new to send
		}
		return resp, nil
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, readLimit))
	resp.Body.Close()
	if req, err = build(); err != nil {
		return nil, err
	}
	setHeader(req, again)
	resp, err = d.c.Do(req)
	if err == nil && resp.StatusCode == http.StatusUnauthorized {
		d.use.Refused = true
	}
	return resp, err
}

// credHeader is the credential's header(s) for the next request, or nil
// without a usable credential. A credential that fails is recorded and not
// asked again.
func (d *prober) credHeader(ctx context.Context) http.Header {
	if d.cred == nil {
		return nil
	}
	h, err := d.cred.Header(ctx)
	if err != nil {
		d.use.Err = err.Error()
		d.cred = nil
		return nil
	}
	return h
}

// setHeader sets h on req, over any header of the same name (the
// credential mcpheal owns replaces one given with -H, as it replaces an
// agent's).
func setHeader(req *http.Request, h http.Header) {
	for k, vs := range h {
		req.Header[http.CanonicalHeaderKey(k)] = slices.Clone(vs)
	}
}

func sameHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, vs := range a {
		if !slices.Equal(vs, b[k]) {
			return false
		}
	}
	return true
}
