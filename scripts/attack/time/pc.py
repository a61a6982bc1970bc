# The CPU-time attack generators' capture writer: scripts/attack/charges/pc.py's, plus segments
# at an offset, a FIN exchange and TSO-sized segments (loopback addresses only).
import importlib.util, os, struct, random
_spec = importlib.util.spec_from_file_location(
    'charges_pc', os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'charges', 'pc.py'))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
ETH, P, tcp, S = _base.ETH, _base.P, _base.tcp, _base.S
class Conn(_base.Conn):
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
