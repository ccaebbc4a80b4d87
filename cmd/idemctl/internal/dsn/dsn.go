// Package dsn keeps the secrets of data source names out of what a
// program prints. It knows every form the module's drivers accept: URLs
// (postgres://, mysql://, redis://, rediss://, unix://, amqp://,
// sqlite://, file:) with a password in the user info or in a
// password-like query parameter (password=, sslpassword=, _auth_pass=…),
// PostgreSQL keyword/value strings (host=db password='s3 cret'), and
// go-sql-driver/mysql's user:password@tcp(host:3306)/db.
//
//	fmt.Println(dsn.Redact("postgres://app:s3cret@db/app?sslpassword=k"))
//	// postgres://app:xxxxx@db/app?sslpassword=xxxxx
//
//	var s dsn.Scrubber
//	s.Add(os.Getenv("DATABASE_URL"))
//	log.Print(s.Scrub(err.Error())) // a driver error that quotes the DSN
//
// Where a string is malformed, so that where its secret ends is not
// certain, more is masked rather than less: a malformed DSN must not leak.
//
// The package has two identical copies: internal/dsn, for the library's
// tests and tools, and cmd/idemctl/internal/dsn, for idemctl, which
// builds from a published library and so uses none of the library's
// internal packages. A test in idemctl's copy keeps the two the same.
package dsn

import (
	"io"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	goredis "github.com/redis/go-redis/v9"
)

// Mask replaces each secret in what Redact and Scrubber return.
const Mask = "xxxxx"

// Redact returns s, a data source name of any form above, with each
// secret replaced by Mask; the rest (user, host, database, options) stays
// for the reader. A password the driver's own parser finds but the
// structure does not (a malformed string) is masked wherever it occurs.
func Redact(s string) string {
	sp := spans(s)
	var b strings.Builder
	last := 0
	for _, x := range sp {
		b.WriteString(s[last:x.start])
		b.WriteString(Mask)
		last = x.end
	}
	b.WriteString(s[last:])
	out := b.String()
	for _, p := range driverSecrets(s) {
		if !inSpan(s, sp, p) {
			out = replaceSecret(out, p)
		}
	}
	return out
}

// inSpan reports whether p occurs in s inside one of the spans: then
// the structure found the secret the driver reads, and occurrences
// elsewhere (a one-letter password in a host name) are not it.
func inSpan(s string, sp []span, p string) bool {
	return slices.ContainsFunc(sp, func(x span) bool { return strings.Contains(s[x.start:x.end], p) })
}

// Secrets returns the secrets s carries, each in every spelling a driver
// or a message may print it in: as written, decoded (%xx, +, a
// keyword/value backslash) and encoded again. A password the driver's
// parser reads from elsewhere (PGPASSWORD, ~/.pgpass) is among them.
func Secrets(s string) []string {
	var plain []string
	for _, x := range spans(s) {
		raw := s[x.start:x.end]
		if x.uncertain {
			// Where the secret ends is a guess; a driver may print any
			// part of it as a host, a port or a user.
			plain = append(plain, strings.FieldsFunc(raw, func(r rune) bool { return strings.ContainsRune("@:/?#", r) })...)
		}
		// A URL's last value runs to the end; the driver stops at a '#'.
		before, _, _ := strings.Cut(raw, "#")
		plain = append(plain, raw, before, unescapeKeywordValue(raw))
		if v, err := url.QueryUnescape(raw); err == nil {
			plain = append(plain, v)
		}
		if v, err := url.PathUnescape(raw); err == nil {
			plain = append(plain, v)
		}
	}
	plain = append(plain, driverSecrets(s)...)
	var out []string
	for _, p := range plain {
		out = append(out, p, url.QueryEscape(p), url.PathEscape(p))
	}
	out = slices.DeleteFunc(out, func(p string) bool { return p == "" || p == Mask })
	slices.Sort(out)
	return slices.Compact(out)
}

// Scrubber masks in any text the secrets of the data source names added
// to it. The zero value is ready; it is not safe for concurrent Add.
type Scrubber struct {
	secrets []string // longest first, so no secret's tail survives a shorter one
}

// Add adds the secrets of the data source name s (see Secrets).
func (sc *Scrubber) Add(s string) {
	sc.secrets = append(sc.secrets, Secrets(s)...)
	slices.SortFunc(sc.secrets, func(a, b string) int { return len(b) - len(a) })
	sc.secrets = slices.Compact(sc.secrets)
}

// Scrub returns text with every secret replaced by Mask.
func (sc *Scrubber) Scrub(text string) string {
	for _, p := range sc.secrets {
		text = replaceSecret(text, p)
	}
	return text
}

// shortSecret is the length under which a secret is masked only where it
// stands alone: a password "a" leaves "database" readable.
const shortSecret = 4

// replaceSecret replaces p in text with Mask: every occurrence, or for a
// short p those not inside a word.
func replaceSecret(text, p string) string {
	if len(p) >= shortSecret {
		return strings.ReplaceAll(text, p, Mask)
	}
	var b strings.Builder
	for {
		i := strings.Index(text, p)
		if i < 0 {
			b.WriteString(text)
			return b.String()
		}
		j := i + len(p)
		alone := (i == 0 || !isWordByte(text[i-1])) && (j == len(text) || !isWordByte(text[j]))
		b.WriteString(text[:i])
		if alone {
			b.WriteString(Mask)
		} else {
			b.WriteString(p)
		}
		text = text[j:]
	}
}

func isWordByte(c byte) bool {
	return c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// Writer returns a writer that scrubs each Write before passing it to w.
// A secret split across two Writes is not recognised; fmt's Fprint
// functions write once per call.
func (sc *Scrubber) Writer(w io.Writer) io.Writer { return scrubWriter{w, sc} }

type scrubWriter struct {
	w  io.Writer
	sc *Scrubber
}

func (w scrubWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(w.w, w.sc.Scrub(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// span is a secret's byte range in a data source name.
type span struct {
	start, end int
	uncertain  bool // a malformed string's guess, wider than the secret
}

var (
	urlScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)
	// keyValue is PostgreSQL's keyword/value form: it starts "keyword =".
	keyValue = regexp.MustCompile(`^\s*[A-Za-z_][A-Za-z0-9_]*\s*=`)
	// pragmaKey is a SQLite _pragma setting an encryption key.
	pragmaKey = regexp.MustCompile(`(?i)^\s*(hex|text)?(re)?key\b`)
	// assignment finds "password=…"-like settings in a string of no
	// known form.
	assignment = regexp.MustCompile(`(?i)[\w.-]*(pass|pwd|secret|token)[\w.-]*\s*[=:]\s*`)
)

// spans returns the byte ranges of s's secrets, in order, not overlapping.
func spans(s string) []span {
	var sp []span
	switch {
	case urlScheme.MatchString(s):
		sp = urlSpans(s)
	case keyValue.MatchString(s):
		sp = keyValueSpans(s)
	case strings.HasPrefix(s, "file:"), strings.HasPrefix(s, "sqlite:"):
		// An opaque SQLite URI; "file:" could also be a MySQL user name.
		sp = append(querySpans(s, strings.IndexByte(s, '?')+1), mysqlSpans(s)...)
	case strings.ContainsAny(s, "@/"):
		sp = mysqlSpans(s)
	default:
		for _, m := range assignment.FindAllStringIndex(s, -1) {
			end := m[1] + strings.IndexAny(s[m[1]:]+" ", " \t\n&;,")
			sp = append(sp, span{m[1], end, false})
		}
	}
	return merge(sp)
}

// merge sorts spans and joins those that overlap or touch.
func merge(sp []span) []span {
	sp = slices.DeleteFunc(sp, func(x span) bool { return x.end <= x.start })
	slices.SortFunc(sp, func(a, b span) int { return a.start - b.start })
	var out []span
	for _, x := range sp {
		if n := len(out); n > 0 && x.start <= out[n-1].end {
			out[n-1].end = max(out[n-1].end, x.end)
			out[n-1].uncertain = out[n-1].uncertain || x.uncertain
			continue
		}
		out = append(out, x)
	}
	return out
}

// urlSpans finds the secrets of scheme://[user[:password]@]host/path?query.
// The user info ends at the last '@': a password with an unescaped '@',
// '/' or '?' is still masked whole, and when the structure is not certain
// (more than one '@', an '@' after a '/' or '?', a string net/url
// rejects) the whole user info goes, user name included.
func urlSpans(s string) []span {
	i := strings.Index(s, "://") + 3
	rest := s[i:]
	// Where the query starts is uncertain too: look from the first '?'
	// as well as from the first after the user info.
	var sp []span
	if q := strings.IndexByte(rest, '?'); q >= 0 {
		sp = querySpans(s, i+q+1)
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		u, err := url.Parse(s)
		certain := err == nil && u.User != nil && strings.IndexAny(rest, "@/?#") == at
		if c := strings.IndexByte(rest[:at], ':'); certain && c >= 0 {
			sp = append(sp, span{i + c + 1, i + at, false})
		} else if !certain {
			sp = append(sp, span{i, i + at, true})
		}
		i += at + 1
		rest = rest[at+1:]
	}
	if q := strings.IndexByte(rest, '?'); q >= 0 {
		sp = append(sp, querySpans(s, i+q+1)...)
	}
	return sp
}

// querySpans finds the password-like values of the query s[from:]
// (k=v&k=v). The last value runs to the end of s, fragment included.
func querySpans(s string, from int) []span {
	if from <= 0 || from > len(s) {
		return nil
	}
	var sp []span
	for i := from; i <= len(s); {
		end := strings.IndexByte(s[i:], '&')
		if end < 0 {
			end = len(s)
		} else {
			end += i
		}
		pair := s[i:end]
		if k, v, ok := strings.Cut(pair, "="); ok && secretSetting(k, v) {
			// An unescaped '&' in the secret leaves pairs without '='
			// behind it: they are the secret's tail.
			for end < len(s) && secretTail(strings.SplitN(s[end+1:], "&", 2)[0]) {
				if next := strings.IndexByte(s[end+1:], '&'); next >= 0 {
					end += 1 + next
				} else {
					end = len(s)
				}
			}
			sp = append(sp, span{i + len(k) + 1, end, false})
		}
		i = end + 1
	}
	return sp
}

// secretTail reports whether the query pair that follows a secret value
// is its tail: no key=value of its own ("a&b", "a&=b").
func secretTail(pair string) bool {
	k, _, ok := strings.Cut(pair, "=")
	return !ok || k == ""
}

// secretSetting reports whether the setting k=v (k and v as written,
// perhaps %-encoded) holds a secret: a password, a token, an encryption key.
func secretSetting(k, v string) bool {
	if d, err := url.QueryUnescape(k); err == nil {
		k = d
	}
	k = strings.TrimLeft(strings.ToLower(strings.TrimSpace(k)), "_")
	if strings.Contains(k, "pass") || strings.Contains(k, "secret") || strings.Contains(k, "token") || k == "pwd" {
		return true
	}
	if k == "pragma" {
		if d, err := url.QueryUnescape(v); err == nil {
			v = d
		}
		return pragmaKey.MatchString(v)
	}
	return false
}

// keyValueSpans finds the secrets of host=db password='s3 cret' …, read
// the way pgconn reads it (quotes, backslash escapes). When the string
// does not parse, everything from the first secret value — or, with none
// seen yet, from where parsing stopped when the rest names one — to the
// end is masked: the secret may run on past where parsing failed.
func keyValueSpans(s string) []span {
	var sp []span
	fail := func(at int) []span {
		if len(sp) > 0 {
			return []span{{sp[0].start, len(s), true}}
		}
		if assignment.MatchString(s[at:]) {
			return []span{{at, len(s), true}}
		}
		return nil
	}
	i := skipSpace(s, 0)
	for i < len(s) {
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 || strings.ContainsAny(strings.TrimSpace(s[i:i+eq]), " \t\n\r\v\f") {
			return fail(i)
		}
		key := strings.TrimSpace(s[i : i+eq])
		i = skipSpace(s, i+eq+1)
		start, end, next := i, i, i
		switch {
		case i == len(s):
		case s[i] != '\'':
			for end < len(s) && !isSpace(s[end]) {
				if s[end] == '\\' {
					end++
				}
				end++
			}
			end = min(end, len(s))
			next = end
		default: // quoted
			start++
			end = start
			for end < len(s) && s[end] != '\'' {
				if s[end] == '\\' {
					end++
				}
				end++
			}
			if end >= len(s) { // unterminated
				if secretSetting(key, "") {
					sp = append(sp, span{start, len(s), true})
				}
				return fail(start)
			}
			next = end + 1
		}
		if secretSetting(key, s[start:end]) {
			sp = append(sp, span{start, end, false})
		}
		i = skipSpace(s, next)
	}
	return sp
}

func isSpace(c byte) bool { return strings.IndexByte(" \t\n\r\v\f", c) >= 0 }

func skipSpace(s string, i int) int {
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	return i
}

// unescapeKeywordValue drops the backslashes of a keyword/value value.
func unescapeKeywordValue(v string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' && i+1 < len(v) {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

// mysqlSpans finds the secrets of [user[:password]@][net[(addr)]]/db?params
// at the positions go-sql-driver/mysql's ParseDSN reads them: the last
// '/', the last '@' before it, the first ':' before that. Without a '/'
// (the driver refuses the string) all before the last '@' is masked.
func mysqlSpans(s string) []span {
	var sp []span
	slash := strings.LastIndexByte(s, '/')
	if slash < 0 {
		if at := strings.LastIndexByte(s, '@'); at >= 0 {
			sp = append(sp, span{0, at, true})
		}
		return append(sp, querySpans(s, strings.IndexByte(s, '?')+1)...)
	}
	if at := strings.LastIndexByte(s[:slash], '@'); at >= 0 {
		if c := strings.IndexByte(s[:at], ':'); c >= 0 {
			sp = append(sp, span{c + 1, at, false})
		}
	}
	if q := strings.IndexByte(s[slash:], '?'); q >= 0 {
		sp = append(sp, querySpans(s, slash+q+1)...)
	}
	return sp
}

// driverSecrets returns the password the driver for s would send, read
// by the driver's own parser; none when it does not parse.
func driverSecrets(s string) []string {
	var out []string
	switch scheme, _, _ := strings.Cut(s, "://"); {
	case scheme == "postgres" || scheme == "postgresql" || (!urlScheme.MatchString(s) && keyValue.MatchString(s)):
		if cfg, err := pgconn.ParseConfig(s); err == nil {
			out = append(out, cfg.Password)
		}
	case scheme == "redis" || scheme == "rediss" || scheme == "unix":
		if o, err := goredis.ParseURL(s); err == nil {
			out = append(out, o.Password)
		}
	case !urlScheme.MatchString(s) && strings.Contains(s, "@"):
		if cfg, err := mysql.ParseDSN(s); err == nil {
			out = append(out, cfg.Passwd)
		}
	}
	return slices.DeleteFunc(out, func(p string) bool { return p == "" })
}
