// Package exchange is the one loop every agent request takes upstream, and
// the one writer of its answer (proxy/doc.go, stages 3 and 4).
//
// An Attempt is send → judge → decide → act (Attempt.Loop): send makes one
// exchange through link; judge classifies the answer (classify.Classify,
// peeking at the first event of an SSE answer) and records whether the
// upstream may have run the request; Decide turns those facts into an
// action, the one pure function whose table test is docs/healing.md's
// "What it does with each answer" and "Replay rules"; the actions pass the
// answer on, heal (heal.Healer) and send again, wait out an outage, refuse
// with -32011, or fail. Attempt.Answer counts the
// outcome and writes the agent's answer: the upstream's (headers with
// every session id replaced, a JSON body, or an SSE answer relayed event
// by event and resumed upstream when the server closes it early), or
// mcpheal's own error (Attempt.Fail, the one table of mcpheal's errors;
// WriteFailure, with the status every client surfaces at once). The
// routes hand their answers to Writer (writer.go), which writes each and
// counts its request once, as Answer does for the session route. Answers
// an agent may resume after its connection drops are kept (AnswerLogs).
//
// An Attempt is three parts. Its call is what is sent: the agent's
// request, its session, the upstream session it goes on and whether it
// may run twice; only the loop changes it (a heal, judge). Its answer
// stream (stream.go) is what one try brings back, and owns all that is
// done with it: the peek at the first event that judge classifies, the
// relay event by event (relay, settle, finish), the bodies fasthttp writes
// to the agent (body.go), the resumption upstream of a stream that ends
// before its response (resume.go), and the events a route reads itself
// (EachEvent); it reads its call, never reaches the rest of the attempt,
// and each try starts it over. The rest is the loop's own: the retry policy, whether
// the request healed or may have run, the outage probe.
//
// An era change found while sending is not acted on here: Attempt.Run
// reports it, and the route stage sends the request again. It imports no
// route. Routes start their attempts with an Env (NewAttempt), which
// gives them the ground and none of its Stages: a route is given the
// stages it uses itself.
package exchange
