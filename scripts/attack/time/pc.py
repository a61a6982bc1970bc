# Minimal classic-pcap writer for the CPU-time attack generators (loopback addresses only).
import struct, random
ETH = b'\x00\x11\x22\x33\x44\x55\x66\x77\x88\x99\xaa\xbb\x08\x00'
class P:
    def __init__(s, out):
        s.f = open(out, 'wb', buffering=1 << 20); s.t = 10**9
        s.f.write(struct.pack('<IHHiIII', 0xa1b2c3d4, 2, 4, 0, 0, 262144, 1))
    def rec(s, fr):
        sec, us = divmod(s.t // 1000, 1000000)
        s.f.write(struct.pack('<IIII', sec, us, len(fr), len(fr))); s.f.write(fr); s.t += 1000
    def close(s): s.f.close()
def tcp(src, sp, dst, dp, seq, ack, fl, p=b''):
    t = struct.pack('>HHIIBBHHH', sp, dp, seq & 0xffffffff, ack & 0xffffffff, 0x50, fl, 65535, 0, 0)
    ip = struct.pack('>BBHHHBBH4s4s', 0x45, 0, 40 + len(p), 0, 0x4000, 64, 6, 0, bytes(src), bytes(dst))
    return ETH + ip + t + p
S = (127, 0, 0, 3)
class Conn:
    def __init__(s, p, c, port=8080, sport=40000):
        s.p = p; s.C = (127, 1 + (c >> 16), (c >> 8) & 255, c & 255); s.cp = sport; s.sp = port
        s.cs = random.getrandbits(32); s.ss = random.getrandbits(32)
        p.rec(tcp(s.C, s.cp, S, s.sp, s.cs, 0, 2)); p.rec(tcp(S, s.sp, s.C, s.cp, s.ss, s.cs + 1, 18))
        s.cs += 1; s.ss += 1; p.rec(tcp(s.C, s.cp, S, s.sp, s.cs, s.ss, 16))
    def c2s(s, data, mss=1400):
        for i in range(0, len(data), mss):
            ch = data[i:i + mss]; s.p.rec(tcp(s.C, s.cp, S, s.sp, s.cs, s.ss, 24, ch)); s.cs += len(ch)
    def s2c(s, data, mss=1400):
        for i in range(0, len(data), mss):
            ch = data[i:i + mss]; s.p.rec(tcp(S, s.sp, s.C, s.cp, s.ss, s.cs, 24, ch)); s.ss += len(ch)
    def c2s_at(s, off, data):  # a client segment at offset `off` from the next expected byte
        s.p.rec(tcp(s.C, s.cp, S, s.sp, s.cs + off, s.ss, 24, data))
    def s2c_at(s, off, data):
        s.p.rec(tcp(S, s.sp, s.C, s.cp, s.ss + off, s.cs, 24, data))
    def fin(s):
        s.p.rec(tcp(s.C, s.cp, S, s.sp, s.cs, s.ss, 17)); s.p.rec(tcp(S, s.sp, s.C, s.cp, s.ss, s.cs + 1, 17))
def tcp_tso(src, sp, dst, dp, seq, ack, fl, p=b''):
    # IPv4 total length 0 (TSO/GRO capture): the payload runs to the end of the captured frame,
    # so one segment may carry up to the pcap record limit.
    t = struct.pack('>HHIIBBHHH', sp, dp, seq & 0xffffffff, ack & 0xffffffff, 0x50, fl, 65535, 0, 0)
    ip = struct.pack('>BBHHHBBH4s4s', 0x45, 0, 0, 0, 0x4000, 64, 6, 0, bytes(src), bytes(dst))
    return ETH + ip + t + p
def c2s_big(k, data):
    mk = tcp if len(data) <= 65000 else tcp_tso
    k.p.rec(mk(k.C, k.cp, S, k.sp, k.cs, k.ss, 24, data)); k.cs += len(data)
