/* wsync plan --fanout (wsync_plan_fanout.c). */
#ifndef WSYNC_PLAN_FANOUT_H
#define WSYNC_PLAN_FANOUT_H

int wsync_plan_fanout(int argc, char **argv);

#endif
