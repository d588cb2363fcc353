// Package chainhash chains block hashes: a prompt's block i is named by a
// hash of blocks 0..i, so two prompts share block i's name only if they
// share everything up to its end.
package chainhash

// Next mixes a block's hash into the hash of what came before it (order
// matters: the mix is not symmetric).
func Next(prev, block uint64) uint64 {
	x := prev*0x9E3779B97F4A7C15 ^ block
	x ^= x >> 32
	x *= 0xD6E8FEB86659FD93
	x ^= x >> 32
	return x
}
