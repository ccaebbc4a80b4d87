package httpidem

import (
	"bytes"
	"strings"
	"testing"
)

// quoteKey writes key as the draft's sf-string.
func quoteKey(key string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
}

// FuzzParseKey checks the Idempotency-Key parser against its documented
// rule (docs/http.md, "Key syntax"): a field sent once, as an sf-string or
// a bare token, of 1 to MaxKeyLength bytes of printable ASCII. Seeds are
// in testdata/fuzz/FuzzParseKey.
func FuzzParseKey(f *testing.F) {
	f.Fuzz(func(t *testing.T, field, second string, maxLen uint8) {
		limit := int(maxLen) + 1
		values := []string{field}
		if second != "" {
			values = append(values, second)
		}
		key, present, err := parseKey(values, limit)

		again, againPresent, againErr := parseKey(values, limit)
		if again != key || againPresent != present || (againErr == nil) != (err == nil) {
			t.Fatalf("not deterministic: %q %t %v, then %q %t %v", key, present, err, again, againPresent, againErr)
		}
		nonBlank := 0
		for _, v := range values {
			if strings.TrimSpace(v) != "" {
				nonBlank++
			}
		}
		if present != (nonBlank > 0) {
			t.Fatalf("present = %t for %d non-blank fields %q", present, nonBlank, values)
		}
		if err != nil || !present {
			if key != "" {
				t.Fatalf("key %q returned with present %t, error %v", key, present, err)
			}
			return
		}
		// Accepted: the documented rule holds.
		if nonBlank != 1 {
			t.Fatalf("accepted %q from %d fields", key, nonBlank)
		}
		if key == "" || len(key) > limit {
			t.Fatalf("accepted a key of %d bytes, limit %d", len(key), limit)
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("accepted %q: byte %#x is not printable ASCII", key, key[i])
			}
		}
		// The key round-trips through the sf-string a client sends, and
		// through a bare token when it can be one.
		if got, _, err := parseKey([]string{quoteKey(key)}, limit); err != nil || got != key {
			t.Fatalf("%q as %s parsed to %q, %v", key, quoteKey(key), got, err)
		}
		if !strings.HasPrefix(key, `"`) && strings.TrimSpace(key) == key {
			if got, _, err := parseKey([]string{key}, limit); err != nil || got != key {
				t.Fatalf("bare %q parsed to %q, %v", key, got, err)
			}
		}
		// A bare field is the key itself, spaces around it aside.
		v := strings.TrimSpace(field)
		if v == "" {
			v = strings.TrimSpace(second)
		}
		if !strings.HasPrefix(v, `"`) && v != key {
			t.Fatalf("bare field %q parsed to %q", v, key)
		}
	})
}

// FuzzFingerprint checks that a request's fingerprint is deterministic
// and tells apart any two requests that differ in method, request URI or
// body — for the methods that reach it, the tokens Config.Validate admits.
// Seeds are in testdata/fuzz/FuzzFingerprint.
func FuzzFingerprint(f *testing.F) {
	f.Fuzz(func(t *testing.T, method1, uri1 string, body1 []byte, method2, uri2 string, body2 []byte) {
		if !isToken(method1) || !isToken(method2) {
			t.Skip("not a method Methods admits")
		}
		a, b := fingerprint(method1, uri1, body1), fingerprint(method2, uri2, body2)
		if !bytes.Equal(a, fingerprint(method1, uri1, bytes.Clone(body1))) {
			t.Fatal("not deterministic")
		}
		same := method1 == method2 && uri1 == uri2 && bytes.Equal(body1, body2)
		if same != bytes.Equal(a, b) {
			t.Fatalf("requests (%q %q %q) and (%q %q %q): same %t, equal fingerprints %t",
				method1, uri1, body1, method2, uri2, body2, same, bytes.Equal(a, b))
		}
		// Changing any one part changes the fingerprint, and so does moving
		// a byte across the boundary of two parts.
		for _, other := range [][]byte{
			fingerprint(method1+"X", uri1, body1),
			fingerprint(method1, uri1+"/", body1),
			fingerprint(method1, uri1, append(bytes.Clone(body1), 0)),
			fingerprint(method1, "X"+uri1, body1),
		} {
			if bytes.Equal(a, other) {
				t.Fatalf("a changed part kept fingerprint %q", a)
			}
		}
		if bytes.Equal(fingerprint(method1+"X", uri1, body1), fingerprint(method1, "X"+uri1, body1)) {
			t.Fatalf("a byte moved from the request URI to the method kept the fingerprint")
		}
	})
}
