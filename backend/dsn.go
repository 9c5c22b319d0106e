package backend

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ParseDSN parses a DSN such as "redis://user:secret@127.0.0.1:6379/0?ttl=10s".
// Unlike url.Parse, its errors never contain the DSN, so a malformed DSN cannot
// leak a password into a log.
func ParseDSN(dsn string) (*url.URL, error) {
	if strings.TrimSpace(dsn) == "" {
		return nil, errors.New("empty DSN")
	}
	u, err := url.Parse(dsn)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			// url.Error repeats the whole input; its inner error names only the
			// offending part (a host, a port, an escape).
			err = ue.Err
		}
		return nil, fmt.Errorf("malformed DSN: %w", err)
	}
	if u.Scheme == "" {
		return nil, errors.New("malformed DSN: no scheme (want e.g. redis://host:6379)")
	}
	return u, nil
}

// Redact returns u as a string with every secret replaced by "xxxxx": the
// user-info password, any query parameter whose name contains "password", and
// the secrets of query values that are DSNs themselves.
func Redact(u *url.URL) string {
	if u == nil {
		return ""
	}
	r := redactURL(u, 0).Redacted()
	if u.Opaque == "" && u.Host == "" && u.User == nil && u.Path == "" && u.Scheme != "" {
		// url.URL drops the "//" of an empty authority (migrate://?from=…).
		r = u.Scheme + "://" + strings.TrimPrefix(r, u.Scheme+":")
	}
	return r
}

// maxNesting bounds the recursion into DSNs nested in query values.
const maxNesting = 4

// redactURL returns a copy of u whose query secrets are masked; the caller's
// Redacted masks the user-info password.
func redactURL(u *url.URL, depth int) *url.URL {
	c := *u
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			c.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
	}
	if u.RawQuery == "" || depth >= maxNesting {
		return &c
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return &c
	}
	changed := false
	for name, vals := range q {
		for i, v := range vals {
			switch {
			case strings.Contains(strings.ToLower(name), "password") && v != "":
				vals[i] = "xxxxx"
				changed = true
			case strings.Contains(v, "://"):
				inner, err := url.Parse(v)
				if err != nil {
					// A malformed DSN may still hold a password: hide it whole.
					vals[i] = "xxxxx"
					changed = true
				} else if r := redactURL(inner, depth+1).String(); r != v {
					vals[i] = r
					changed = true
				}
			}
		}
	}
	if changed {
		c.RawQuery = q.Encode()
	}
	return &c
}

// secrets lists the secrets Redact masks in u: its password, password query
// parameters, and those of DSNs nested in query values.
func secrets(u *url.URL, depth int) []string {
	var out []string
	if u.User != nil {
		if pw, ok := u.User.Password(); ok && pw != "" {
			out = append(out, pw)
		}
	}
	if u.RawQuery == "" || depth >= maxNesting {
		return out
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return out
	}
	for name, vals := range q {
		for _, v := range vals {
			switch {
			case strings.Contains(strings.ToLower(name), "password") && v != "":
				out = append(out, v)
			case strings.Contains(v, "://"):
				if inner, err := url.Parse(v); err == nil {
					out = append(out, secrets(inner, depth+1)...)
				} else if _, rest, ok := strings.Cut(v, "://"); ok {
					// Malformed: take what sits between the first ':' and
					// the last '@' of the authority as the password.
					auth, _, _ := strings.Cut(rest, "/")
					if at := strings.LastIndex(auth, "@"); at >= 0 {
						if _, pw, ok := strings.Cut(auth[:at], ":"); ok && pw != "" {
							out = append(out, pw)
						}
					}
				}
			}
		}
	}
	return out
}

// RedactError returns err with every form (plain or escaped) of every secret
// Redact masks in u replaced by "xxxxx" in its message, still unwrapping to
// err; it returns err itself if the message holds none. A secret is masked
// where it stands alone, not inside a longer word: a password "tc" is masked
// in "root:tc@h" and "password=tc", never in "etcd".
func RedactError(err error, u *url.URL) error {
	if err == nil || u == nil {
		return err
	}
	msg := err.Error()
	found := false
	for _, pw := range secrets(u, 0) {
		forms := []string{pw, url.QueryEscape(pw), url.PathEscape(pw), url.UserPassword("", pw).String()[1:]}
		forms = append(forms, url.QueryEscape(url.QueryEscape(pw)), url.QueryEscape(url.UserPassword("", pw).String()[1:]))
		for _, f := range forms {
			if f != "" {
				var ok bool
				if msg, ok = maskWord(msg, f); ok {
					found = true
				}
			}
		}
	}
	if !found {
		return err
	}
	return &redactedError{msg: msg, err: err}
}

// maskWord replaces with "xxxxx" each occurrence of secret in msg that does
// not continue a word of msg: where secret begins (ends) with a letter or
// digit, the byte before (after) it must not be one, or must end a %XX
// escape. It reports whether it replaced any.
func maskWord(msg, secret string) (string, bool) {
	var b strings.Builder
	found := false
	for i := 0; ; {
		j := strings.Index(msg[i:], secret)
		if j < 0 {
			b.WriteString(msg[i:])
			break
		}
		start, end := i+j, i+j+len(secret)
		left := !isWordByte(secret[0]) || start == 0 || !isWordByte(msg[start-1]) ||
			(start >= 3 && msg[start-3] == '%' && isHexByte(msg[start-2]) && isHexByte(msg[start-1]))
		right := !isWordByte(secret[len(secret)-1]) || end == len(msg) || !isWordByte(msg[end])
		if left && right {
			b.WriteString(msg[i:start])
			b.WriteString("xxxxx")
			i, found = end, true
			continue
		}
		b.WriteString(msg[i : start+1])
		i = start + 1
	}
	return b.String(), found
}

// isWordByte reports whether c is part of a word: an ASCII letter or digit,
// '_', or a byte of a multi-byte UTF-8 character.
func isWordByte(c byte) bool {
	return c == '_' || c >= 0x80 || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

func isHexByte(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// SplitHosts splits a DSN's comma-separated host list ("h1:2379,h2,[::1]")
// into host:port addresses, adding defaultPort to a host given without one.
// An empty list, an empty entry and a malformed host:port are errors.
func SplitHosts(list, defaultPort string) ([]string, error) {
	if list == "" {
		return nil, errors.New("no host")
	}
	var hosts []string
	for _, h := range strings.Split(list, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return nil, fmt.Errorf("empty host in the host list %q", list)
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			if strings.Contains(h, ":") && !strings.HasPrefix(h, "[") {
				return nil, fmt.Errorf("host %q: %w", h, err)
			}
			h = net.JoinHostPort(strings.Trim(h, "[]"), defaultPort)
		}
		hosts = append(hosts, h)
	}
	return hosts, nil
}

// Params reads the query parameters of a DSN, each at most once. Each getter
// removes the parameter it reads; Done then reports every parameter nobody
// asked for, so a typo such as "?tll=10s" is an error.
type Params struct {
	v     url.Values
	errs  []error
	asked []string // every name a getter was asked for, present or not: the known parameters
}

// NewParams reads the query of u; a query that does not parse (a ';'
// separator, a bad %-escape) is an error for Done.
func NewParams(u *url.URL) *Params {
	v, err := url.ParseQuery(u.RawQuery)
	p := &Params{v: v}
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("DSN query: %w", err))
	}
	return p
}

func (p *Params) take(name string) (string, bool) {
	if !slices.Contains(p.asked, name) {
		p.asked = append(p.asked, name)
	}
	vs, ok := p.v[name]
	if !ok {
		return "", false
	}
	delete(p.v, name)
	if len(vs) > 1 {
		p.errs = append(p.errs, fmt.Errorf("parameter %q given %d times", name, len(vs)))
	}
	return vs[len(vs)-1], true
}

// String returns the parameter's value, or def if it is absent.
func (p *Params) String(name, def string) string {
	if s, ok := p.take(name); ok {
		return s
	}
	return def
}

// Duration returns the parameter parsed with time.ParseDuration, or def if it is
// absent. A value that does not parse, or is not > 0, is recorded as an error.
func (p *Params) Duration(name string, def time.Duration) time.Duration {
	s, ok := p.take(name)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		p.errs = append(p.errs, fmt.Errorf("parameter %s=%q: want a positive duration such as 10s or 500ms", name, s))
		return def
	}
	return d
}

// Float returns the parameter as a float64 in [lo, hi], or def if it is absent.
func (p *Params) Float(name string, def, lo, hi float64) float64 {
	s, ok := p.take(name)
	if !ok {
		return def
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < lo || f > hi {
		p.errs = append(p.errs, fmt.Errorf("parameter %s=%q: want a number from %g to %g", name, s, lo, hi))
		return def
	}
	return f
}

// Int returns the parameter as an int in [lo, hi], or def if it is absent.
func (p *Params) Int(name string, def, lo, hi int) int {
	s, ok := p.take(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		p.errs = append(p.errs, fmt.Errorf("parameter %s=%q: want a whole number from %d to %d", name, s, lo, hi))
		return def
	}
	return n
}

// Bool returns the parameter parsed with strconv.ParseBool, or def if absent.
func (p *Params) Bool(name string, def bool) bool {
	s, ok := p.take(name)
	if !ok {
		return def
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		p.errs = append(p.errs, fmt.Errorf("parameter %s=%q: want true or false", name, s))
		return def
	}
	return b
}

// Rest removes and returns every parameter not yet read, for a driver that
// hands them on to its client library (which validates them itself).
func (p *Params) Rest() url.Values {
	r := p.v
	p.v = url.Values{}
	return r
}

// PortableParams are the DSN parameters package dlock reads for every backend
// before the driver sees the DSN. Done names them among the known parameters.
var PortableParams = []string{"ttl", "autorenew", "label", "reentrant"}

// WithoutPortable returns a copy of u without the PortableParams, for code
// that opens a backend's client from a DSN without package dlock.
func WithoutPortable(u *url.URL) *url.URL {
	c := *u
	q := c.Query()
	for _, name := range PortableParams {
		q.Del(name)
	}
	c.RawQuery = q.Encode()
	return &c
}

// Done, called after the last getter (and Rest), returns nil if every
// parameter was well formed and read, else an error wrapping ErrInvalidOption
// that names the malformed and unread ones (never their values) and the known
// ones.
func (p *Params) Done() error {
	errs := p.errs
	if len(p.v) > 0 {
		unknown := make([]string, 0, len(p.v))
		for k := range p.v {
			unknown = append(unknown, k)
		}
		slices.Sort(unknown)
		msg := "unknown DSN parameter"
		if len(unknown) > 1 {
			msg += "s"
		}
		msg += " " + strings.Join(quoteAll(unknown), ", ")
		known := slices.Sorted(slices.Values(append(slices.Clone(p.asked), PortableParams...)))
		msg += " (known: " + strings.Join(slices.Compact(known), ", ") + ")"
		errs = append(errs, errors.New(msg))
	}
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("%w: %w", ErrInvalidOption, errs[0])
	}
	return fmt.Errorf("%w: %w", ErrInvalidOption, errors.Join(errs...))
}

func quoteAll(s []string) []string {
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = strconv.Quote(v)
	}
	return q
}
