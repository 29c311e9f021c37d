package store

// slotOf returns the Redis Cluster hash slot of a key without a hash tag
// of its own, such as a key tag (what is between the braces of the
// Redis keys): CRC16 (XMODEM) of it, mod 16384, as Redis and go-redis
// compute it (go-redis keeps its function internal).
func slotOf(tag string) int {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) & 16383
}
