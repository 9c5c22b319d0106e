// CuratorPeer drives Apache Curator's lock and leader recipes for
// zookeeper/curator_test.go, which runs it with the JDK's single-file
// source launcher (no build step):
//
//	java -cp /usr/share/java/curator-recipes.jar:/usr/share/java/slf4j-nop.jar \
//	    CuratorPeer.java
//
// It reads one command a line on stdin and answers on stdout, one line each.
// The first command is "connect CONNECT_STRING", answered "ready" once the
// client is connected (so the JVM can start while the server does). H names
// a handle: a recipe object the commands create and then use. A command on
// a mutex handle runs on that handle's own thread (InterProcessMutex is
// owned by the thread that acquired it), so a waiting acquire blocks only
// its handle, and its answer comes when it is granted; the other commands
// answer at once.
//
//	connect CONNECT    CuratorFramework, started        -> ready
//	mutex H PATH       InterProcessMutex on PATH        -> ok H
//	acquire H          acquire(), waiting for as long   -> acquired H
//	acquire H MS       acquire(MS, milliseconds)        -> acquired H | notacquired H
//	release H          release()                        -> released H
//	nodes H            getParticipantNodes()            -> nodes H NAME,NAME,...  (queue order)
//	selector H PATH ID LeaderSelector, setId(ID), start -> ok H; later: elected H (takeLeadership
//	                   began) and, after "resign H",       resigned H (it returned)
//	resign H           makes takeLeadership return
//	latch H PATH ID    LeaderLatch(PATH, ID), start     -> ok H; later: elected H / deposed H
//	leader H           getLeader() of a selector/latch  -> leader H ID (ID "-" if none)
//	participants H     getParticipants()                -> participants H ID:L,ID:L,... (L: 1 leads)
//	has H              hasLeadership()                  -> has H true|false
//	close H            close() of a selector/latch      -> closed H
//	semaphore H PATH N InterProcessSemaphoreV2(PATH, N) -> ok H
//	lease H            acquire() of a semaphore, waiting -> leased H
//	lease H MS         acquire(MS, milliseconds)        -> leased H | notleased H
//	return H           returns the handle's oldest lease -> returned H
//	leases H           getParticipantNodes()            -> leases H NAME,NAME,...
//
// A semaphore handle's commands, like a mutex handle's, run on its own
// thread, so a waiting lease blocks only its handle.
//
// A command that throws answers "error H <exception>". The process exits
// when stdin ends.

import java.io.BufferedReader;
import java.io.Closeable;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderLatchListener;
import org.apache.curator.framework.recipes.leader.LeaderSelector;
import org.apache.curator.framework.recipes.leader.LeaderSelectorListenerAdapter;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryNTimes;

public class CuratorPeer {
    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static final Map<String, InterProcessMutex> mutexes = new ConcurrentHashMap<>();
    static final Map<String, ExecutorService> threads = new ConcurrentHashMap<>();
    static final Map<String, LeaderSelector> selectors = new ConcurrentHashMap<>();
    static final Map<String, CountDownLatch> resigns = new ConcurrentHashMap<>();
    static final Map<String, LeaderLatch> latches = new ConcurrentHashMap<>();
    static final Map<String, InterProcessSemaphoreV2> semaphores = new ConcurrentHashMap<>();
    static final Map<String, java.util.Deque<Lease>> leases = new ConcurrentHashMap<>();

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String first = in.readLine();
        if (first == null || !first.startsWith("connect ")) {
            throw new IllegalArgumentException("the first command must be connect, got " + first);
        }
        String connect = first.substring("connect ".length());
        CuratorFramework client = CuratorFrameworkFactory.newClient(connect, 10_000, 10_000, new RetryNTimes(20, 100));
        client.start();
        if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
            throw new IllegalStateException("no connection to " + connect);
        }
        say("ready");
        for (String line; (line = in.readLine()) != null; ) {
            String[] w = line.trim().split(" ");
            if (w.length < 2) {
                say("error - bad command: " + line);
                continue;
            }
            String h = w[1];
            try {
                run(client, w, h);
            } catch (Exception e) {
                say("error " + h + " " + e);
            }
        }
        System.exit(0); // leave the recipes' threads behind
    }

    static void run(CuratorFramework client, String[] w, String h) throws Exception {
        switch (w[0]) {
            case "mutex" -> {
                mutexes.put(h, new InterProcessMutex(client, w[2]));
                threads.put(h, Executors.newSingleThreadExecutor());
                say("ok " + h);
            }
            case "acquire" -> {
                InterProcessMutex m = mutexes.get(h);
                Long ms = w.length > 2 ? Long.valueOf(w[2]) : null;
                threads.get(h).execute(() -> {
                    try {
                        if (ms == null) {
                            m.acquire();
                            say("acquired " + h);
                        } else {
                            say((m.acquire(ms, TimeUnit.MILLISECONDS) ? "acquired " : "notacquired ") + h);
                        }
                    } catch (Exception e) {
                        say("error " + h + " " + e);
                    }
                });
            }
            case "release" -> {
                InterProcessMutex m = mutexes.get(h);
                threads.get(h).execute(() -> {
                    try {
                        m.release();
                        say("released " + h);
                    } catch (Exception e) {
                        say("error " + h + " " + e);
                    }
                });
            }
            case "nodes" -> {
                List<String> names = new ArrayList<>();
                for (String p : mutexes.get(h).getParticipantNodes()) {
                    names.add(p.substring(p.lastIndexOf('/') + 1));
                }
                say("nodes " + h + " " + String.join(",", names));
            }
            case "selector" -> {
                CountDownLatch resign = new CountDownLatch(1);
                LeaderSelector s = new LeaderSelector(client, w[2], new LeaderSelectorListenerAdapter() {
                    @Override
                    public void takeLeadership(CuratorFramework c) throws Exception {
                        say("elected " + h);
                        try {
                            resign.await();
                        } finally {
                            say("resigned " + h);
                        }
                    }
                });
                s.setId(w[3]);
                selectors.put(h, s);
                resigns.put(h, resign);
                s.start();
                say("ok " + h);
            }
            case "resign" -> resigns.get(h).countDown();
            case "latch" -> {
                LeaderLatch l = new LeaderLatch(client, w[2], w[3]);
                l.addListener(new LeaderLatchListener() {
                    @Override
                    public void isLeader() {
                        say("elected " + h);
                    }

                    @Override
                    public void notLeader() {
                        say("deposed " + h);
                    }
                });
                latches.put(h, l);
                l.start();
                say("ok " + h);
            }
            case "leader" -> {
                Participant p = selectors.containsKey(h) ? selectors.get(h).getLeader() : latches.get(h).getLeader();
                say("leader " + h + " " + (p.getId().isEmpty() ? "-" : p.getId()));
            }
            case "participants" -> {
                Collection<Participant> ps = selectors.containsKey(h) ? selectors.get(h).getParticipants() : latches.get(h).getParticipants();
                List<String> ids = new ArrayList<>();
                for (Participant p : ps) {
                    ids.add(p.getId() + ":" + (p.isLeader() ? 1 : 0));
                }
                say("participants " + h + " " + String.join(",", ids));
            }
            case "has" -> say("has " + h + " " + (selectors.containsKey(h) ? selectors.get(h).hasLeadership() : latches.get(h).hasLeadership()));
            case "close" -> {
                Closeable c = selectors.containsKey(h) ? selectors.remove(h) : latches.remove(h);
                c.close();
                say("closed " + h);
            }
            case "semaphore" -> {
                semaphores.put(h, new InterProcessSemaphoreV2(client, w[2], Integer.parseInt(w[3])));
                leases.put(h, new java.util.concurrent.ConcurrentLinkedDeque<>());
                threads.put(h, Executors.newSingleThreadExecutor());
                say("ok " + h);
            }
            case "lease" -> {
                InterProcessSemaphoreV2 s = semaphores.get(h);
                Long ms = w.length > 2 ? Long.valueOf(w[2]) : null;
                threads.get(h).execute(() -> {
                    try {
                        Lease l = ms == null ? s.acquire() : s.acquire(ms, TimeUnit.MILLISECONDS);
                        if (l != null) {
                            leases.get(h).add(l);
                        }
                        say((l != null ? "leased " : "notleased ") + h);
                    } catch (Exception e) {
                        say("error " + h + " " + e);
                    }
                });
            }
            case "return" -> threads.get(h).execute(() -> {
                try {
                    semaphores.get(h).returnLease(leases.get(h).remove());
                    say("returned " + h);
                } catch (Exception e) {
                    say("error " + h + " " + e);
                }
            });
            case "leases" -> {
                List<String> names = new ArrayList<>();
                for (String p : semaphores.get(h).getParticipantNodes()) {
                    names.add(p.substring(p.lastIndexOf('/') + 1));
                }
                say("leases " + h + " " + String.join(",", names));
            }
            default -> say("error " + h + " unknown command " + w[0]);
        }
    }
}
