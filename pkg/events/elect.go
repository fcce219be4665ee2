package events

import (
	"iter"
)

// Electorate is the set of nodes that share the reporting of problems every node sees
// alike: the invalid fields of a Service are the same input on every node, so one Event
// per Service says it all, where one per node would multiply it by the cluster's size.
// watch.NodeNames implements it.
type Electorate interface {
	// HasSynced reports whether the set is known: the Nodes have been listed once.
	HasSynced() bool
	// Nodes yields the name of every node in the set, in no particular order.
	Nodes() iter.Seq[string]
}

// ElectedNode returns the node that reports about key ("namespace/name" of a Service):
// the one with the highest rendezvous score, ties going to the smaller name. It returns ""
// when nodes is empty.
//
// Rendezvous (highest random weight) hashing needs no coordination: every node computes
// the same winner from the same set of names, and a node joining or leaving moves only the
// keys it wins or won, so the Services whose Events another node writes stay with it.
func ElectedNode(key string, nodes iter.Seq[string]) string {
	var best string
	var bestScore uint64
	for n := range nodes {
		s := rendezvousScore(n, key)
		if best == "" || s > bestScore || (s == bestScore && n < best) {
			best, bestScore = n, s
		}
	}
	return best
}

// rendezvousScore hashes node and key together: FNV-1a over node, a zero byte and key,
// then a 64-bit finaliser (splitmix64's), because FNV's high bits mix poorly and a
// comparison of scores depends on them. The function is part of the protocol between
// sluice versions: nodes that disagree on it may both report a Service, or neither; change
// it only with a note in the release.
func rendezvousScore(node, key string) uint64 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	for i := 0; i < len(node); i++ {
		h ^= uint64(node[i])
		h *= prime64
	}
	h *= prime64 // the separator, a zero byte (h ^= 0 is a no-op)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= prime64
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}
