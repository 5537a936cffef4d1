package trace

import (
	"errors"
	"io"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvradix/kvradix/hashing"
)

func TestReaderErrorsNameLineAndField(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}`
	tests := []struct{ line, field, msg string }{
		{`{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1]}`, "hash_ids", "1 ids for 600 input tokens"},
		{`{"input_length": 600, "output_length": 5, "hash_ids": [1, 2]}`, "timestamp", "missing"},
		{`{"timestamp": -1, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}`, "timestamp", "negative"},
		{`{"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": []}`, "input_length", "want > 0"},
		{`{"timestamp": 0, "input_length": 600, "hash_ids": [1, 2]}`, "output_length", "missing"},
		{`{"timestamp": 0, "input_length": 600, "output_length": -2, "hash_ids": [1, 2]}`, "output_length", "want >= 0"},
		{`{"timestamp": 0, "input_length": 600, "output_length": 5}`, "hash_ids", "missing"},
		{`{"timestamp": 0, "input_length": "many", "output_length": 5, "hash_ids": [1, 2]}`, "input_length", "cannot use"},
		{`{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, -2]}`, "hash_ids", "cannot use"},
		{`{"timestamp": 0,`, "", "unexpected end"},
		// ceil(input_length/512) overflowed in the message before.
		{`{"timestamp": 0, "input_length": 9223372036854775807, "output_length": 5, "hash_ids": [1]}`, "hash_ids", "want ceil(9223372036854775807/512) = 18014398509481984"},
	}
	for _, tc := range tests {
		r := NewReader(strings.NewReader(good + "\n\n" + tc.line + "\n"))
		if _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
		_, err := r.Next()
		var le *LineError
		if !errors.As(err, &le) || le.Line != 3 || le.Field != tc.field || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: got %v, want line 3 field %q saying %q", tc.line, err, tc.field, tc.msg)
		}
	}
}

func TestDefaultTrace(t *testing.T) {
	reqs, err := ReadAll(Default())
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 12031 {
		t.Fatalf("%d requests, want 12031", len(reqs))
	}
	first := reqs[0]
	if first.Timestamp != 0 || first.InputLength != 6758 || first.OutputLength != 500 || len(first.HashIDs) != 14 {
		t.Fatalf("first request %+v", first)
	}
	for i, r := range reqs {
		if r.HashIDs[0] != 0 {
			t.Fatalf("request %d does not start with block 0", i)
		}
		if i > 0 && r.Timestamp < reqs[i-1].Timestamp {
			t.Fatalf("request %d arrives before %d", i, i-1)
		}
	}
	r := NewReader(Default())
	for range 12031 {
		if _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("after the last: %v", err)
	}
}

// Prefix sharing survives tokenisation and hashing at any block size:
// requests sharing k trace blocks share exactly the KV blocks inside them.
func TestTokensPreserveSharing(t *testing.T) {
	a := Request{InputLength: 1500, HashIDs: []uint64{7, 8, 9}}
	b := Request{InputLength: 1300, HashIDs: []uint64{7, 8, 10}}
	c := Request{InputLength: 1300, HashIDs: []uint64{11, 8, 10}}
	ta, tb, tc := Tokens(nil, a), Tokens(nil, b), Tokens(nil, c)
	if len(ta) != 1500 || len(tb) != 1300 {
		t.Fatalf("lengths %d %d", len(ta), len(tb))
	}
	if !slices.Equal(ta[:1024], tb[:1024]) || slices.Equal(ta[1024:1300], tb[1024:1300]) {
		t.Fatal("shared ids must give shared tokens, different ids different ones")
	}
	if slices.Equal(tb[512:1024], tc[512:1024]) == false {
		t.Fatal("tokens of an id must not depend on the position's neighbours")
	}
	for _, bs := range []int{16, 64, 100} {
		ha := hashing.SequenceHashes(nil, hashing.LocalHashes(nil, ta, bs, hashing.Options{}))
		hb := hashing.SequenceHashes(nil, hashing.LocalHashes(nil, tb, bs, hashing.Options{}))
		shared := 0
		for shared < min(len(ha), len(hb)) && ha[shared] == hb[shared] {
			shared++
		}
		if shared != 1024/bs {
			t.Errorf("block size %d: %d shared blocks, want %d", bs, shared, 1024/bs)
		}
	}
	for _, tok := range ta {
		if tok >= Vocab {
			t.Fatalf("token %d out of vocabulary", tok)
		}
	}
}

func TestSynthesize(t *testing.T) {
	cfg := DefaultSynth()
	cfg.Requests = 500
	a, err := Synthesize(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Synthesize(cfg)
	if len(a) != 500 || !slices.EqualFunc(a, b, func(x, y Request) bool {
		return x.Timestamp == y.Timestamp && x.InputLength == y.InputLength && slices.Equal(x.HashIDs, y.HashIDs)
	}) {
		t.Fatal("same seed, different workloads")
	}
	sysBlocks := cfg.SystemTokens / TraceBlockSize
	firstIDs := map[uint64]int{}
	extended := 0
	for i, r := range a {
		if want := (r.InputLength + TraceBlockSize - 1) / TraceBlockSize; len(r.HashIDs) != want {
			t.Fatalf("request %d: %d ids for %d tokens", i, len(r.HashIDs), r.InputLength)
		}
		if i > 0 && r.Timestamp <= a[i-1].Timestamp {
			t.Fatalf("request %d not after %d", i, i-1)
		}
		firstIDs[r.HashIDs[0]]++
		// A later turn extends some earlier prompt's full blocks.
		for j := i - 1; j >= 0; j-- {
			p := a[j]
			full := p.InputLength / TraceBlockSize
			if full > sysBlocks && len(r.HashIDs) > full && slices.Equal(r.HashIDs[:full], p.HashIDs[:full]) {
				extended++
				break
			}
		}
	}
	if len(firstIDs) < 2 || len(firstIDs) > cfg.SystemPrompts {
		t.Fatalf("%d distinct system prompts used", len(firstIDs))
	}
	if extended < 100 {
		t.Fatalf("only %d of 500 requests extend an earlier turn", extended)
	}
	// Zipf popularity: the most popular system prompt dominates.
	top := 0
	for _, n := range firstIDs {
		top = max(top, n)
	}
	if top < 500/cfg.SystemPrompts*2 {
		t.Fatalf("no skew: top system prompt opens %d of 500", top)
	}
	bad := cfg
	bad.Skew = 0.5
	if _, err := Synthesize(bad); err == nil {
		t.Fatal("skew 0.5 accepted")
	}
}

func TestEmptyTraceIsAnError(t *testing.T) {
	for _, in := range []string{"", "\n\n  \n"} {
		if reqs, err := ReadAll(strings.NewReader(in)); !errors.Is(err, ErrEmpty) {
			t.Errorf("%q: %d requests, %v; want ErrEmpty", in, len(reqs), err)
		}
	}
}

func TestSynthRejectsRatesThatGiveNoTime(t *testing.T) {
	for _, rate := range []float64{math.Inf(1), 1e300, math.NaN(), 0, -1} {
		c := DefaultSynth()
		c.Rate = rate
		if _, err := Synthesize(c); err == nil || !strings.Contains(err.Error(), "rate") {
			t.Errorf("rate %v: %v", rate, err)
		}
	}
	c := DefaultSynth()
	c.Requests = 0
	if _, err := Synthesize(c); err == nil {
		t.Error("zero requests accepted")
	}
}

// Stretch makes every id k ids (shared prefixes stay shared) and the prompt
// k times longer at tbs tokens an id, its ids cut to those it uses.
func TestStretch(t *testing.T) {
	a := Request{InputLength: 600, OutputLength: 3, HashIDs: []uint64{0, 1}}
	b := Request{InputLength: 1024, OutputLength: 3, HashIDs: []uint64{0, 2}}
	if got := Stretch(a, 1, TraceBlockSize); !reflect.DeepEqual(got, a) {
		t.Fatalf("identity: %+v", got)
	}
	for _, tc := range []struct {
		k, tbs int
		want   Request
	}{
		{2, 512, Request{InputLength: 1200, OutputLength: 3, HashIDs: []uint64{0, 1, 2}}},
		{4, 128, Request{InputLength: 600, OutputLength: 3, HashIDs: []uint64{0, 1, 2, 3, 4}}},
	} {
		got := Stretch(a, tc.k, tc.tbs)
		if !reflect.DeepEqual(got, tc.want) {
			t.Fatalf("k %d tbs %d: %+v, want %+v", tc.k, tc.tbs, got, tc.want)
		}
		if n := len(TokensOf(nil, got, tc.tbs)); n != got.InputLength {
			t.Fatalf("k %d tbs %d: %d tokens for %d", tc.k, tc.tbs, n, got.InputLength)
		}
		// The shared first id stays a shared prefix of k·tbs tokens.
		ta, tb := TokensOf(nil, got, tc.tbs), TokensOf(nil, Stretch(b, tc.k, tc.tbs), tc.tbs)
		share := tc.k * tc.tbs
		if !slices.Equal(ta[:share], tb[:share]) || slices.Equal(ta[share:share+tc.tbs/2], tb[share:share+tc.tbs/2]) {
			t.Fatalf("k %d tbs %d: prefix sharing broken", tc.k, tc.tbs)
		}
	}
}

func TestBursts(t *testing.T) {
	c := DefaultBurst()
	c.Bursts, c.Siblings = 5, 3
	reqs, err := Bursts(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 15 {
		t.Fatalf("%d requests, want 15", len(reqs))
	}
	prefix := c.PrefixTokens / TraceBlockSize
	byPrefix := map[uint64][]Request{}
	for i, r := range reqs {
		if i > 0 && r.Timestamp < reqs[i-1].Timestamp {
			t.Fatalf("request %d arrives before %d", i, i-1)
		}
		if r.InputLength != prefix*TraceBlockSize+c.SuffixTokens || len(r.HashIDs) != (r.InputLength+TraceBlockSize-1)/TraceBlockSize {
			t.Fatalf("request %d: %d tokens, %d ids", i, r.InputLength, len(r.HashIDs))
		}
		byPrefix[r.HashIDs[0]] = append(byPrefix[r.HashIDs[0]], r)
	}
	if len(byPrefix) != 5 {
		t.Fatalf("%d distinct prefixes, want 5", len(byPrefix))
	}
	for _, sib := range byPrefix {
		if len(sib) != 3 || sib[2].Timestamp-sib[0].Timestamp > c.SpreadMs || !slices.Equal(sib[0].HashIDs[:prefix], sib[1].HashIDs[:prefix]) || sib[0].HashIDs[prefix] == sib[1].HashIDs[prefix] {
			t.Fatalf("a burst: %+v", sib)
		}
	}
	if again, _ := Bursts(c); !reflect.DeepEqual(again, reqs) {
		t.Fatal("equal configurations gave different workloads")
	}
	for _, bad := range []BurstConfig{{Bursts: 0, Siblings: 1, Rate: 1, SuffixTokens: 1, OutputTokens: 1}, {Bursts: 1, Siblings: 1, Rate: 0, SuffixTokens: 1, OutputTokens: 1}, {Bursts: 1, Siblings: 1, Rate: 1, SuffixTokens: 0, OutputTokens: 1}} {
		if _, err := Bursts(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
