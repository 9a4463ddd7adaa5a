// A Go program whose CPU time is its own: main.main calls main.spinHot, a loop the
// compiler cannot fold away, for about as long as asked (seconds, first argument).
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

//go:noinline
func spinHot(n uint64) uint64 {
	x := n
	for i := uint64(0); i < 5_000_000; i++ {
		x = x*6364136223846793005 + 1442695040888963407
		x ^= x >> 29
	}
	return x
}

func main() {
	secs := 1.0
	if len(os.Args) > 1 {
		if s, err := strconv.ParseFloat(os.Args[1], 64); err == nil {
			secs = s
		}
	}
	end := time.Now().Add(time.Duration(secs * float64(time.Second)))
	var acc uint64
	for time.Now().Before(end) {
		acc += spinHot(acc)
	}
	fmt.Println(acc)
}
