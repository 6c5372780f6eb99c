// gcm_go: ground truth for qprof's Go crypto uprobes.
//
// Does what a Go QUIC endpoint does per packet, COUNT times: one AES-128-GCM
// Seal of a 1200-byte payload, one Open of it, and one single-block
// cipher.Block.Encrypt of a 16-byte sample (the header-protection mask).
// Then writes OUT.json: {"seal": n, "open": n, "block_encrypt": n,
// "plaintext_bytes": n} (bytes sealed, which equals bytes opened).
//
// Usage: gcm_go COUNT OUT.json
package main

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
)

const payload = 1200

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: gcm_go COUNT OUT.json")
		os.Exit(1)
	}
	n, err := strconv.Atoi(os.Args[1])
	if err != nil || n <= 0 {
		fmt.Fprintln(os.Stderr, "gcm_go: COUNT must be a positive integer")
		os.Exit(1)
	}
	key := make([]byte, 16)
	block, err := aes.NewCipher(key)
	if err != nil {
		panic(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	nonce := make([]byte, aead.NonceSize())
	plain := make([]byte, payload)
	sealed := make([]byte, 0, payload+aead.Overhead())
	opened := make([]byte, 0, payload)
	mask := make([]byte, 16)
	aad := make([]byte, 20)
	var seals, opens, blocks, bytes int
	for i := 0; i < n; i++ {
		nonce[0], nonce[1] = byte(i), byte(i>>8)
		ct := aead.Seal(sealed[:0], nonce, plain, aad)
		seals++
		bytes += len(plain)
		if _, err := aead.Open(opened[:0], nonce, ct, aad); err != nil {
			panic(err)
		}
		opens++
		block.Encrypt(mask, ct[:16])
		blocks++
	}
	out, _ := json.Marshal(map[string]int{"seal": seals, "open": opens, "block_encrypt": blocks,
		"plaintext_bytes": bytes})
	if err := os.WriteFile(os.Args[2], append(out, '\n'), 0o644); err != nil {
		panic(err)
	}
}
