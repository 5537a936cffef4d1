package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvradix/kvradix/kvevent"
)

// Peers, as Dynamo's standalone indexer has them: other services indexing
// the same engines. A service that starts empty (no saved state to
// recover) restores its indexes from the first peer whose GET /dump
// answers, then follows its own engines: replication without a bus. The
// peers are Config.Peers and those POST /register_peer adds.

// peerTimeout bounds one peer's dump, the whole of it, where its length
// is not known; a dump that says its length gets as long as the peer
// gives itself to write it (see dumpWriteTime) if that is longer. Once it
// answers, Config.PeerIdleTimeout bounds each wait for more. (Before its
// answer, a peer may be writing the whole dump aside, as ours do, to
// tell its length.)
const peerTimeout = 5 * time.Minute

// CheckPeer accepts a peer: an http or https URL with a host and no
// query (New drops peers it refuses; check them first).
func CheckPeer(u string) error {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Hostname() == "" || p.RawQuery != "" || p.Fragment != "" {
		return fmt.Errorf("%w: url: %q, want http(s)://host[:port][/path]", ErrInvalid, u)
	}
	if port := p.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || !validPort(n) {
			return fmt.Errorf("%w: url: %q: port %s, want 1 to 65535", ErrInvalid, u, port)
		}
	}
	return nil
}

// MaxPeers bounds the peers a service keeps (Config.Peers, /register_peer).
const MaxPeers = 64

// RegisterPeer adds a peer (once).
func (s *Service) RegisterPeer(u string) error {
	if err := CheckPeer(u); err != nil {
		return err
	}
	u = strings.TrimSuffix(u, "/")
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Contains(s.peers, u) {
		if len(s.peers) >= MaxPeers {
			return fmt.Errorf("%w: %d peers, at most %d", ErrFull, len(s.peers), MaxPeers)
		}
		s.peers = append(s.peers, u)
	}
	return nil
}

// DeregisterPeer removes a peer; ErrUnknownPeer if it is not one.
func (s *Service) DeregisterPeer(u string) error {
	u = strings.TrimSuffix(u, "/")
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.Index(s.peers, u)
	if i < 0 {
		return ErrUnknownPeer
	}
	s.peers = slices.Delete(s.peers, i, i+1)
	return nil
}

// Peers lists the peers, in the order they were added.
func (s *Service) Peers() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string{}, s.peers...) // [] in JSON when there are none, not null
}

// recoverFromPeers restores the indexes from the first peer whose dump
// reads whole, the peers tried in turn; it returns the peer and the
// events applied, or every peer's error.
func (s *Service) recoverFromPeers(ctx context.Context) (string, int, error) {
	var errs []error
	for _, peer := range s.Peers() {
		n, err := s.recoverFromPeer(ctx, peer)
		if err == nil {
			return peer, n, nil
		}
		errs = append(errs, fmt.Errorf("peer %s: %w", peer, err))
	}
	return "", 0, errors.Join(errs...)
}

// recoverFromPeer reads a peer's dump and applies it. The dump is read as
// it streams, an event at a time, so that it costs the index it builds
// and no more; a dump that fails midway leaves nothing behind.
func (s *Service) recoverFromPeer(ctx context.Context, peer string) (int, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	whole := time.AfterFunc(peerTimeout, func() { cancel(fmt.Errorf("the dump not read whole in %v", peerTimeout)) })
	defer whole.Stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, peer+"/dump", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, causeOf(ctx, err)
	}
	defer resp.Body.Close()
	idle := s.cfg.PeerIdleTimeout
	quiet := time.AfterFunc(idle, func() { cancel(fmt.Errorf("nothing from the peer for %v midway", idle)) })
	quiet.Stop() // armed by each read (watched)
	if resp.ContentLength > 0 {
		whole.Reset(max(peerTimeout, dumpWriteTime(resp.ContentLength)))
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, fmt.Errorf("GET /dump: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	n, err := s.buildFromDump(&watched{r: resp.Body, t: quiet, idle: idle})
	return n, causeOf(ctx, err)
}

// causeOf is err, or why ctx ended if it has: the peer's silence or the
// dump's bound rather than a bare "context canceled".
func causeOf(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", context.Cause(ctx), err)
	}
	return err
}

// watched is a reader whose every read arms t for idle: the time a read
// waits on the peer is bounded, the time spent applying what it brought
// (the index's lanes may be busy) is not.
type watched struct {
	r    io.Reader
	t    *time.Timer
	idle time.Duration
}

func (w *watched) Read(p []byte) (int, error) {
	w.t.Reset(w.idle)
	defer w.t.Stop()
	return w.r.Read(p)
}

// buildFromDump builds indexes from the dump r, and makes them the
// service's if it reads whole; else it closes them.
func (s *Service) buildFromDump(r io.Reader) (int, error) {
	built := map[modelKey]*index{}
	n, err := readDump(json.NewDecoder(r), func(name string, blockSize int) (func(kvevent.RouterEvent) error, error) {
		k, err := parseIndexName(name, blockSize)
		if err != nil {
			return nil, err
		}
		if built[k] != nil {
			return nil, fmt.Errorf("index %s twice", name)
		}
		if len(built) >= s.cfg.MaxIndexes {
			return nil, fmt.Errorf("%w: index %s: more than %d indexes", ErrFull, name, s.cfg.MaxIndexes)
		}
		idx, err := s.createIndex(k, blockSize)
		if err != nil {
			return nil, err
		}
		built[k] = idx
		return idx.sink.ApplyEvent, nil
	})
	for _, idx := range built {
		if _, ferr := idx.pool.Flush(); ferr != nil {
			err = errors.Join(err, ferr)
		}
	}
	if err == nil {
		err = s.adopt(built)
	}
	if err != nil {
		for _, idx := range built {
			idx.close()
		}
		return 0, err
	}
	return n, nil
}

// adopt makes the indexes built from a peer the service's, unless it has
// indexes of its own by now.
func (s *Service) adopt(built map[modelKey]*index) error {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.indexes) > 0 || s.closed {
		return errors.New("the service is no longer empty")
	}
	for k, idx := range built {
		s.indexes[k] = idx
	}
	return nil
}

// parseIndexName reads "model:routing group", a dump's key.
func parseIndexName(name string, blockSize int) (modelKey, error) {
	model, group, ok := strings.Cut(name, ":")
	if !ok || group == "" {
		return modelKey{}, fmt.Errorf("index %q: want \"model:routing group\"", name)
	}
	if err := checkIndex(model, group, blockSize); err != nil {
		return modelKey{}, fmt.Errorf("index %q: %w", name, err)
	}
	return modelKey{model, group}, nil
}

// readDump reads a /dump answer in Dynamo's current shape, each index's
// events handed, one by one, to what open returns for it; block_size must
// come before events (as both write it). It returns the events read.
func readDump(dec *json.Decoder, open func(name string, blockSize int) (func(kvevent.RouterEvent) error, error)) (int, error) {
	n := 0
	if err := expectDelim(dec, '{', "the dump"); err != nil {
		return 0, err
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return n, err
		}
		name, _ := tok.(string)
		if err := expectDelim(dec, '{', fmt.Sprintf("index %q (a bare list of events is an older peer's dump, without its block size)", name)); err != nil {
			return n, err
		}
		blockSize := 0
		var apply func(kvevent.RouterEvent) error
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return n, err
			}
			switch field, _ := tok.(string); field {
			case "block_size":
				if err := dec.Decode(&blockSize); err != nil {
					return n, fmt.Errorf("index %q: block_size: %w", name, err)
				}
			case "events":
				if blockSize == 0 {
					return n, fmt.Errorf("index %q: events before its block_size", name)
				}
				if apply, err = open(name, blockSize); err != nil {
					return n, err
				}
				if err := expectDelim(dec, '[', fmt.Sprintf("index %q: events", name)); err != nil {
					return n, err
				}
				for dec.More() {
					var ev kvevent.RouterEvent
					if err := dec.Decode(&ev); err != nil {
						return n, fmt.Errorf("index %q: event %d: %w", name, n, err)
					}
					if err := apply(ev); err != nil {
						return n, fmt.Errorf("index %q: event %d: %w", name, n, err)
					}
					n++
				}
				if _, err := dec.Token(); err != nil { // ]
					return n, err
				}
			default:
				var skip json.RawMessage
				if err := dec.Decode(&skip); err != nil {
					return n, err
				}
			}
		}
		if _, err := dec.Token(); err != nil { // }
			return n, err
		}
		if apply == nil {
			return n, fmt.Errorf("index %q: no events", name)
		}
	}
	_, err := dec.Token() // }
	return n, err
}

// expectDelim reads the delimiter d, or says that what is read is not it.
func expectDelim(dec *json.Decoder, d json.Delim, what string) error {
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if got, ok := tok.(json.Delim); !ok || got != d {
		return fmt.Errorf("%s: want %q, got %v", what, d, tok)
	}
	return nil
}
