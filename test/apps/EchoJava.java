// EchoJava: a blocking java.net echo server and client for the application
// tier (test/apps/run.sh), launched as a single source file:
//
//   java EchoJava.java server PORT CONNECTIONS
//       accepts CONNECTIONS connections on 127.0.0.1:PORT, each served by its
//       own thread with blocking streams (every byte read is written back
//       until EOF, then the socket is closed). Prints READY once listening,
//       then "SERVED connections=C echoed=BYTES" and exits 0 when every
//       connection ended cleanly.
//   java EchoJava.java client PORT CONNECTIONS BYTES
//       opens CONNECTIONS connections at once (a thread each); each writes
//       BYTES pseudo-random bytes from a second thread while reading the echo,
//       shuts its output down, reads to EOF and checks every byte. Prints
//       "RESULT connections=C ok=K bytes=TOTAL" and exits 0 iff all came back.
// Every socket has a 60 s read timeout: a lost byte is an error, not a hang.
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

public class EchoJava {
  static byte[] pattern(int n, int seed) {
    byte[] b = new byte[n];
    int x = seed * 0x9E3779B1 + 1;
    for (int i = 0; i < n; i++) {
      x = x * 1103515245 + 12345;
      b[i] = (byte) (x >>> 24);
    }
    return b;
  }

  public static void main(String[] args) throws Exception {
    int port = Integer.parseInt(args[1]);
    int conns = Integer.parseInt(args[2]);
    InetAddress lo = InetAddress.getByName("127.0.0.1");
    List<Thread> threads = new ArrayList<>();
    AtomicInteger ok = new AtomicInteger();
    AtomicLong bytes = new AtomicLong();
    if (args[0].equals("server")) {
      try (ServerSocket ss = new ServerSocket(port, 128, lo)) {
        System.out.println("READY");
        System.out.flush();
        for (int i = 0; i < conns; i++) {
          Socket s = ss.accept();
          Thread t = new Thread(() -> {
            try (s) {
              s.setSoTimeout(60000);
              InputStream in = s.getInputStream();
              OutputStream out = s.getOutputStream();
              byte[] buf = new byte[65536];
              long n = 0;
              for (int r; (r = in.read(buf)) > 0; n += r) out.write(buf, 0, r);
              out.flush();
              bytes.addAndGet(n);
              ok.incrementAndGet();
            } catch (Exception e) {
              System.err.println("server connection: " + e);
            }
          });
          t.start();
          threads.add(t);
        }
      }
      for (Thread t : threads) t.join();
      System.out.println("SERVED connections=" + ok.get() + " echoed=" + bytes.get());
      System.exit(ok.get() == conns ? 0 : 1);
    }
    int size = Integer.parseInt(args[3]);
    for (int i = 0; i < conns; i++) {
      final int id = i;
      Thread t = new Thread(() -> {
        byte[] want = pattern(size, id);
        try (Socket s = new Socket(lo, port)) {
          s.setSoTimeout(60000);
          OutputStream out = s.getOutputStream();
          Thread writer = new Thread(() -> {
            try {
              for (int off = 0; off < size; off += 8192) out.write(want, off, Math.min(8192, size - off));
              s.shutdownOutput();
            } catch (Exception e) {
              System.err.println("client " + id + " write: " + e);
            }
          });
          writer.start();
          InputStream in = s.getInputStream();
          byte[] got = new byte[size + 1];
          int n = 0;
          for (int r; (r = in.read(got, n, got.length - n)) > 0; ) n += r;
          writer.join();
          boolean same = n == size;
          for (int k = 0; same && k < size; k++) same = got[k] == want[k];
          if (same) {
            ok.incrementAndGet();
            bytes.addAndGet(n);
          } else {
            System.err.println("client " + id + ": " + n + " of " + size + " bytes back, equal=" + same);
          }
        } catch (Exception e) {
          System.err.println("client " + id + ": " + e);
        }
      });
      t.start();
      threads.add(t);
    }
    for (Thread t : threads) t.join();
    System.out.println("RESULT connections=" + conns + " ok=" + ok.get() + " bytes=" + bytes.get());
    System.exit(ok.get() == conns ? 0 : 1);
  }
}
