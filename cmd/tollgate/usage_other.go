//go:build !unix

package main

// readUsage: no getrusage here; the bench prints zeros for CPU and sleeps.
func readUsage() procUsage { return procUsage{} }
