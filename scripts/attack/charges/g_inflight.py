# Candidate H: a session's in_flight table (HashMap<Id, ExchangeKey>, up to max_in_flight=4096
# entries) is covered only by the flat 768 bytes of session fixed_cost, and keeps its capacity
# after its entries are removed. One batch of R requests per session, then the connection closes.
import sys,random,json; sys.path.insert(0, __import__('os').path.dirname(__file__)); from pc import *
random.seed(8); out,N,R=sys.argv[1],int(sys.argv[2]),int(sys.argv[3])
p=P(out)
for c in range(N):
    k=Conn(p,c)
    body=b'['+b','.join(b'{"jsonrpc":"2.0","id":%d,"method":"a"}'%i for i in range(R))+b']'
    req=b'POST /mcp HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nMcp-Session-Id: s%d\r\nContent-Length: %d\r\n\r\n'%(c,len(body))+body
    k.c2s(req,mss=60000)
    # both sides close
    p.rec(tcp(k.C,k.cp,S,k.sp,k.cs,k.ss,17)); k.cs+=1
    p.rec(tcp(S,k.sp,k.C,k.cp,k.ss,k.cs,17)); k.ss+=1
    k.ack()
p.close()
