package replybound

import (
	"testing"
)

// FuzzReplyBounds feeds arbitrary bytes to the reply bounds as they come
// off a connection: they never panic, and their verdict (and where a
// stream stands) does not depend on how the bytes were cut into reads.
func FuzzReplyBounds(f *testing.F) {
	for _, seed := range []string{
		"*3\r\n:1\r\n$5\r\nab\r\nc\r\n*2\r\n+OK\r\n$-1\r\n",
		"*2147483647\r\n", "$536870912\r\nxx", "%2\r\n+a\r\n:1\r\n+b\r\n:2\r\n", "*-5\r\n", "$-1\r\n", "!3\r\nerr\r\n",
		"$" + "000000000000000000000000000009\r\n", "+" + "aaaa", ":seven\r\n", "\r\n", "\n", "_\r\n,1.5\r\n#t\r\n(12345\r\n",
	} {
		f.Add([]byte(seed), uint8(3))
	}
	f.Fuzz(func(t *testing.T, stream []byte, cut uint8) {
		var whole, pieces replyBounds
		errWhole := whole.scan(stream)
		size := int(cut%16) + 1
		var errPieces error
		for i := 0; i < len(stream) && errPieces == nil; i += size {
			errPieces = pieces.scan(stream[i:min(i+size, len(stream))])
		}
		if (errWhole == nil) != (errPieces == nil) {
			t.Fatalf("whole: %v; in reads of %d: %v", errWhole, size, errPieces)
		}
		if errWhole == nil && (whole.skip != pieces.skip || whole.lineLen != pieces.lineLen) {
			t.Fatalf("whole ends at skip %d line %d; in reads of %d at skip %d line %d", whole.skip, whole.lineLen, size, pieces.skip, pieces.lineLen)
		}
		if whole.skip < 0 || whole.skip > MaxBulk+2 || whole.lineLen < 0 || whole.lineLen > MaxLine {
			t.Fatalf("out of bounds: skip %d line %d", whole.skip, whole.lineLen)
		}
	})
}
