/* Headers bindgen reads for dpdk-sys. Everything DPDK declares as `static inline` is not a
 * linkable symbol; shim.c re-exports the ones we need as lvk_* functions. */
#ifndef LVK_DPDK_WRAPPER_H
#define LVK_DPDK_WRAPPER_H

#include <rte_config.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

/* Fast-path functions re-exported from shim.c. */
uint16_t lvk_rte_eth_rx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **rx_pkts,
                              uint16_t nb_pkts);
uint16_t lvk_rte_eth_tx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **tx_pkts,
                              uint16_t nb_pkts);
struct rte_mbuf *lvk_rte_pktmbuf_alloc(struct rte_mempool *mp);
int lvk_rte_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned count);
void lvk_rte_pktmbuf_free(struct rte_mbuf *m);
void *lvk_rte_pktmbuf_mtod(struct rte_mbuf *m);
uint16_t lvk_rte_pktmbuf_data_len(const struct rte_mbuf *m);
uint32_t lvk_rte_pktmbuf_pkt_len(const struct rte_mbuf *m);
uint16_t lvk_rte_pktmbuf_nb_segs(const struct rte_mbuf *m);
uint16_t lvk_rte_pktmbuf_headroom(const struct rte_mbuf *m);
uint16_t lvk_rte_pktmbuf_tailroom(const struct rte_mbuf *m);
char *lvk_rte_pktmbuf_append(struct rte_mbuf *m, uint16_t len);
char *lvk_rte_pktmbuf_prepend(struct rte_mbuf *m, uint16_t len);
char *lvk_rte_pktmbuf_adj(struct rte_mbuf *m, uint16_t len);
int lvk_rte_pktmbuf_trim(struct rte_mbuf *m, uint16_t len);
void lvk_rte_pktmbuf_reset(struct rte_mbuf *m);
int lvk_rte_errno(void);
unsigned lvk_rte_lcore_id(void);

#endif
